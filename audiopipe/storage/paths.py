"""Tell a URL from a local path before anything touches the file system.

`Path("s3://bucket/x")` silently becomes the relative folder `s3:/bucket/x`, so without this check
`audiopipe shard --out s3://bucket/x` writes a local folder called `s3:` and reports success. Until a scheme is
supported, every entry point refuses it in one line instead.
"""

from __future__ import annotations

import os
import re

from audiopipe.errors import AudiopipeError

# Two or more letters before ':/' so that a Windows drive letter ("C:/") is never mistaken for a scheme; one slash
# is enough because a URL that went through pathlib has already lost its second slash.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):/")


class UnsupportedURL(AudiopipeError, ValueError):
    """A `scheme://` argument where only a local (or mounted) path is supported."""


def url_scheme(value: str | os.PathLike[str]) -> str | None:
    m = _SCHEME.match(os.fspath(value))
    return m.group(1).lower() if m else None


def require_local(value: str | os.PathLike[str], what: str) -> str:
    """Return `value` as a string if it is a local path; raise `UnsupportedURL` naming `what` if it is a URL."""
    text = os.fspath(value)
    scheme = url_scheme(text)
    if scheme is not None:
        raise UnsupportedURL(f"{what} {text}: {scheme}:// is not supported; give a local or mounted folder "
                             f"(copy or mount the objects first)")
    return text
