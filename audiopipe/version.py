"""The package version, in a module of its own so that modules which record it (the shard manifest) need not
import the package's public names."""

__version__ = "0.1.0"
