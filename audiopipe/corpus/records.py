"""What discovery hands on: an `Utterance` per usable audio, a `Reject` per refused input, and the rules an
utterance id follows (ids become tar member names and file names in exports).

Every reader of a corpus (the walk, layouts/, manifests/) makes these; nothing here reads a file.
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Any


# slots: a million utterances without a __dict__ each is ~150 MB less.
@dataclass(slots=True)
class Utterance:
    """One usable audio file, described from its header (nothing decoded yet)."""

    id: str  # path relative to the root, without extension, '/'-separated
    path: str  # absolute path
    source: str  # path relative to the root, with extension
    speaker: str
    text: str  # "" when no transcript was found
    sample_rate: int
    num_samples: int  # frames per channel, from the header
    channels: int
    duration: float  # seconds, from the header
    extra: dict[str, Any] = field(default_factory=dict)  # manifest columns other than path/id/text/speaker

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def reject(self, reason: str, detail: str) -> Reject:
        """A Reject for this utterance (used when a later stage refuses it)."""
        return Reject(self.path, self.source, reason, detail)


@dataclass(slots=True)
class Reject:
    """An input that will not be written, and why. `reason` is a short code from docs/corpus.md."""

    path: str
    source: str
    reason: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def id_problem(uid: str) -> str | None:
    """Why a manifest `id` cannot name an utterance, or None. Ids become tar member names and file names in
    exports, so they must be relative '/'-separated paths that stay inside their folder."""
    if not isinstance(uid, str):
        return "is not a string"
    if not uid.strip():
        return "is empty"
    if uid.startswith("/"):
        return "is absolute (ids are relative, '/'-separated)"
    if "\\" in uid:
        return "contains a backslash (separate folders with '/')"
    ctrl = next((c for c in uid if unicodedata.category(c) in ("Cc", "Cs")), None)
    if ctrl is not None:
        what = "control character" if unicodedata.category(ctrl) == "Cc" else "lone surrogate"
        return f"contains the {what} U+{ord(ctrl):04X}"
    parts = uid.split("/")
    if "" in parts:
        return "has an empty path segment ('//' or a trailing '/')"
    if any(p in (".", "..") for p in parts):
        return "has a '.' or '..' path segment"
    return None


def unique_ids(utts: list[Utterance], rejects: list[Reject], what: str) -> list[Utterance]:
    """The utterances whose id is safe and not taken by an earlier one (in (id, source) order); the others become
    `bad_id` / `duplicate_id` rejects. Ids from index files and manifests become tar member and file names."""
    kept: list[Utterance] = []
    seen: dict[str, str] = {}
    for u in sorted(utts, key=lambda u: (u.id, u.source)):
        problem = id_problem(u.id)
        if problem:
            rejects.append(Reject(u.path, u.source, "bad_id", f"{what} id {u.id!r} {problem}"))
            continue
        if u.id in seen:
            rejects.append(Reject(u.path, u.source, "duplicate_id", f"id {u.id!r} is already used by {seen[u.id]}"))
            continue
        seen[u.id] = u.source
        kept.append(u)
    return kept
