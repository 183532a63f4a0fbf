"""The members of an uncompressed tar that can be read in place, and why the others cannot.

A member read in place is a byte range [offset, offset + size) of the tar file (audiopipe.decode.members). That
holds only for a plain regular member whose bytes are all there, so everything else is refused with a reason
rather than read as if it were one:

- a GNU / PAX sparse member: its holes are not stored, so the range would mix the next member's bytes into
  the audio (`bad_member`);
- a hard or symbolic link, a device, a pipe (`bad_member`);
- a second member of the same name: tar keeps both, and which one a reader takes depends on the reader
  (`duplicate_member`; the first is kept);
- an archive inside the archive (`nested_archive`: unpack it first);
- a name that is not UTF-8 (`bad_encoding`);
- a member whose bytes run past the end of a tar cut short (`truncated`). The members before it are kept: a
  damaged tar loses only what is damaged.

Folders are not inputs and are skipped. Used by the Emilia layout and the lhotse Shar reader.
"""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass, field
from typing import BinaryIO

from audiopipe.storage import guard

# Names of archives and compressed files: a member with one of these names is not read as audio or JSON.
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".zip", ".7z",
                    ".gz", ".bz2", ".xz", ".zst", ".rar")
# First bytes of compressed files: a tar that starts with one cannot be read in place.
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
               (b"PK\x03\x04", "zip"), (b"7z\xbc\xaf\x27\x1c", "7z"))
# Exceptions tarfile raises on damaged headers besides TarError (number fields, names, PAX records).
TAR_ERRORS = (tarfile.TarError, OSError, ValueError, EOFError, UnicodeError, OverflowError, IndexError)


@dataclass(slots=True)
class Member:
    name: str
    offset: int  # of its data in the tar file
    size: int


@dataclass
class Listing:
    members: list[Member] = field(default_factory=list)  # plain, complete, uniquely named files, in tar order
    refused: list[tuple[str, str, str]] = field(default_factory=list)  # (member name, reason, detail)
    damage: str | None = None  # why the listing stopped early (the tar is cut short or damaged), else None


def compressed(head: bytes) -> str | None:
    """The compression a file's first bytes show, or None."""
    return next((name for magic, name in _COMPRESSED if head.startswith(magic)), None)


def open_tar(path: str, what: str = "tar") -> tuple[BinaryIO, tarfile.TarFile]:
    """(file, TarFile) of an uncompressed tar, opened through the guard; Refused (`unreadable`) with one line
    for a compressed file or one that is not a tar at all."""
    f = guard.open_regular(path, what)
    try:
        kind = compressed(f.read(8))
        f.seek(0)
        if kind is not None:
            raise guard.Refused("unreadable", f"{guard.shown(path)} is {kind}-compressed: a compressed tar cannot "
                                              f"be read in place, decompress it first")
        try:
            return f, tarfile.open(fileobj=f, mode="r:")  # "r:": uncompressed only, members are byte ranges
        except TAR_ERRORS as e:
            raise guard.Refused("unreadable", f"{guard.shown(path)} is not a readable tar ({e})") from None
    except BaseException:
        f.close()
        raise


def list_members(path: str, what: str = "tar") -> Listing:
    """The tar's members, sorted into those that can be read in place and those refused (see the module doc).
    Refused with one line (guard.Refused) when the file is not an uncompressed tar at all."""
    f, tf = open_tar(path, what)
    out = Listing()
    seen: dict[str, int] = {}
    last = ""
    try:
        size = os.fstat(f.fileno()).st_size
        while True:
            try:
                m = tf.next()
            except TAR_ERRORS as e:  # a damaged header: what follows cannot be found; what came before is kept
                out.damage = f"the tar is damaged after its first {len(seen)} readable members ({e})"
                out.refused.append((f"(after {guard.shown(last)})" if last else "(start)", "unreadable", out.damage))
                break
            if m is None:
                break
            if m.isdir():
                continue
            name = last = m.name
            problem = _problem(m, name, size)
            if problem is None and name in seen:
                problem = ("duplicate_member", f"a second member named {name}; the first (at byte {seen[name]}) "
                                               f"is kept")
            if problem is not None:
                out.refused.append((guard.shown(name), *problem))
                if problem[0] == "truncated":
                    out.damage = problem[1]
                    break
                continue
            seen[name] = m.offset_data
            out.members.append(Member(name, m.offset_data, m.size))
    finally:
        tf.close()
        f.close()
    return out


def _problem(m: tarfile.TarInfo, name: str, tar_size: int) -> tuple[str, str] | None:
    bad_name = guard.name_problem(name)
    if bad_name:
        return "bad_encoding", f"member {guard.shown(name)}: {bad_name}"
    if m.issparse():
        return "bad_member", (f"{name} is a sparse member (its holes are not stored as bytes, so it cannot be read "
                              f"in place): pack the tar without --sparse")
    if m.islnk() or m.issym():
        kind = "hard link" if m.islnk() else "symbolic link"
        return "bad_member", f"{name} is a {kind} to {guard.shown(m.linkname)}: pack the file itself"
    if not m.isreg():
        return "bad_member", f"{name} is not a regular file (tar type {m.type!r})"
    if name.lower().endswith(ARCHIVE_SUFFIXES):
        return "nested_archive", f"{name} is an archive inside the tar: unpack it and list its files instead"
    if m.offset_data + m.size > tar_size:
        return "truncated", (f"{name} needs bytes {m.offset_data}-{m.offset_data + m.size} but the tar ends at "
                             f"{tar_size}: the tar is cut short (the members before it are read)")
    return None


def read_member(path: str, member: Member, kind: str, what: str, f: BinaryIO | None = None) -> bytes:
    """A small member's bytes (JSON beside the audio), at most guard.LIMITS[kind]; Refused `too_large` else.
    `f`: the tar already open (one open for all the members of a tar)."""
    limit = guard.LIMITS[kind]
    if member.size > limit:
        raise guard.Refused("too_large", f"{what} is {member.size} bytes, more than the {limit}-byte limit for a "
                                         f"{kind}")
    if f is None:
        with guard.open_regular(path, "tar") as own:
            return read_member(path, member, kind, what, own)
    f.seek(member.offset)
    data = f.read(member.size)
    if len(data) < member.size:
        raise guard.Refused("truncated", f"{what}: the tar ends inside it")
    return data
