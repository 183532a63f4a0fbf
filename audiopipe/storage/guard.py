"""How audiopipe opens the input files it reads: regular files only, opened without blocking, read up to a
size limit for their kind, text decoded strictly.

Corpora come from crawls and other people's disks. A named pipe called `a.txt` would block `open()` until a
writer appears (the whole job hangs); a sidecar that is a symlink to `/dev/zero`, or a "transcript" of 3 GB,
would be read whole (the machine runs out of memory); a latin-1 line would be stored as mojibake or stop the
job with a traceback. Every reader of sidecars, index files (Kaldi, AISHELL-3, LibriTTS, VCTK, Emilia),
manifests, TextGrids, tars and tar members goes through these functions (audiopipe/corpus/), and so do the
audio files before libsndfile opens them (audiopipe/decode/).

Each refusal is a `Refused(reason, detail)`: `reason` is a reject code of docs/corpus.md (`missing`,
`unreadable`, `too_large`, `bad_encoding`, or the caller's own for text), the detail one line naming the file
and, for text, the line. A reader turns it into a reject of the inputs it concerns, or stops with it when it
concerns a whole index.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO, Iterator

from audiopipe.errors import AudiopipeError

# The most bytes read from a file of each kind. Past these a file is not what its name says (a transcript of a
# megabyte is a mistake, a JSON sidecar of a tar member is a few hundred bytes), and reading it whole could
# take the machine's memory.
LIMITS = {
    "transcript": 1 << 20,  # a sidecar x.txt / x.lab: one utterance's text
    "json member": 1 << 20,  # the JSON beside each audio member of an Emilia tar
    "jsonl line": 64 << 20,  # one line of a JSON-lines index or manifest
    "index line": 1 << 20,  # one line of a Kaldi / AISHELL-3 table
    "textgrid": 64 << 20,  # an MFA TextGrid (one utterance's alignment)
    "table": 1 << 30,  # a whole text table read at once: metadata.csv, SPEAKERS.txt, trans.tsv, speaker-info.txt
}
NOT_REGULAR = "not a regular file (a named pipe, socket or device)"


class Refused(AudiopipeError, ValueError):
    """A file, or a line of it, that will not be read. `reason` is a reject code, `detail` one line."""

    def __init__(self, reason: str, detail: str, raw: bytes | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.raw = raw  # the refused line's bytes (lines()), so that a table can still tell which id it named


def shown(path: str) -> str:
    """A path as it can be printed and written to JSON: bytes that are not UTF-8 (kept by Python as lone
    surrogates) become `\\xNN`."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def name_problem(path: str) -> str | None:
    """Why a file name cannot travel into ids, Arrow strings and JSON records, or None."""
    if path.isascii():  # nearly every name: no encode per file of a million-file walk
        return None
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return f"the file name is not UTF-8 ({shown(path)}): rename it"
    return None


def regular(path: str, what: str = "file") -> os.stat_result:
    """The stat of `path` if it is a regular file (symlinks followed); `missing` / `unreadable` Refused else.
    For files that a library opens by name (libsndfile, pyarrow, lhotse): nothing is opened here."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise Refused("missing", f"no such file: {shown(path)}") from None
    except OSError as e:
        raise Refused("unreadable", f"cannot stat the {what} {shown(path)}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise Refused("unreadable", NOT_REGULAR if what == "file" else f"{what} {shown(path)} is {NOT_REGULAR}")
    return st


def open_fd(path: str, what: str = "file") -> tuple[int, os.stat_result]:
    """(descriptor, stat) of `path` opened for reading, if it is a regular file; the caller closes it. The open
    does not block (O_NONBLOCK: a named pipe would wait for a writer), and the check is on the opened file, not
    on a name that may change in between."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise Refused("missing", f"no such file: {shown(path)}") from None
    except OSError as e:
        raise Refused("unreadable", f"cannot open the {what} {shown(path)}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused("unreadable", NOT_REGULAR if what == "file" else f"{what} {shown(path)} is {NOT_REGULAR}")
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def open_regular(path: str, what: str = "file") -> BinaryIO:
    """`path` opened for binary reading, if it is a regular file (see open_fd)."""
    fd, _ = open_fd(path, what)
    try:
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str, kind: str, what: str | None = None) -> bytes:
    """A whole regular file of at most LIMITS[kind] bytes; more is a `too_large` Refused (nothing more is read)."""
    limit = LIMITS[kind]
    with open_regular(path, what or kind) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Refused("too_large", f"{what or kind} {shown(path)} is larger than the {_size(limit)} limit for a "
                                   f"{kind}")
    return data


def decode(data: bytes, where: str, reason: str = "bad_encoding", first_line: int = 1) -> str:
    """Strict UTF-8 (a leading BOM dropped); a `reason` Refused naming `where:line` and the offending byte."""
    try:
        return data.decode("utf-8-sig" if first_line == 1 else "utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise Refused(reason, f"{where}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at column {column}); "
                              f"convert it to UTF-8 (iconv -f latin1 -t utf-8)") from None


def read_text(path: str, kind: str, what: str | None = None, reason: str = "bad_encoding") -> str:
    """A whole small text file: read_bytes then decode (the Refused for bad text is `reason`)."""
    return decode(read_bytes(path, kind, what), shown(path), reason)


def read_text_or_none(path: str, kind: str, what: str | None = None, reason: str = "bad_encoding") -> str | None:
    """read_text, or None when there is no such file."""
    try:
        return read_text(path, kind, what, reason)
    except Refused as e:
        if e.reason == "missing":
            return None
        raise


def lines(f: BinaryIO, where: str, kind: str = "index line",
          reason: str = "bad_encoding") -> Iterator[tuple[int, str | Refused]]:
    """(line number, text) for each line of an open binary file, without its line end; a line that is not
    UTF-8 or longer than LIMITS[kind] comes as a Refused in place of its text, so that the caller refuses what
    that line names and reads on (a BOM is dropped from the first line only)."""
    limit = LIMITS[kind]
    n = 0
    while True:
        raw = f.readline(limit + 1)
        if not raw:
            return
        n += 1
        if len(raw) > limit and not raw.endswith(b"\n"):
            head = raw[:4096]
            while raw and not raw.endswith(b"\n"):  # skip the rest of the long line, a bounded read at a time
                raw = f.readline(limit + 1)
            yield n, Refused("too_large", f"{where}:{n}: a line longer than {_size(limit)}", head)
            continue
        try:
            yield n, decode(raw, where, reason, n).rstrip("\r\n")
        except Refused as e:
            yield n, Refused(e.reason, e.detail, raw)


def text_lines(path: str, what: str, kind: str = "index line",
               reason: str = "bad_encoding") -> Iterator[tuple[int, str | Refused]]:
    """lines() of the regular file at `path` (see open_regular)."""
    with open_regular(path, what) as f:
        yield from lines(f, shown(path), kind, reason)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"
