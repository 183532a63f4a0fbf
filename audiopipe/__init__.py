"""audiopipe: speech training data, extracted once, read at memcpy speed.

The flow, one sub-package per stage:
    corpus -> decode -> features -> shard (writer) -> index -> reader -> sampler -> collate -> (trainers/)
"""

__version__ = "0.1.0"
