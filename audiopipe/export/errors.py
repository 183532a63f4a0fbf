"""The one error every exporter raises: a shard folder that cannot be exported, or an output it must not replace.

A ValueError, so the command line prints it as one `audiopipe: error: ...` line and exits 2."""


class ExportError(ValueError):
    """A shard folder that cannot be exported, or an output that would be overwritten."""


def need(module: str, what: str) -> None:
    """Refuse in one line when an optional package an exporter writes with is not installed."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise ExportError(f"{what} needs the {module} package: pip install -e \".[exports]\" "
                          f"(or pip install {module})") from None
