"""The settings of one `audiopipe shard` run, as plain JSON-able data.

A job is what travels to Ray workers (they rebuild features from it) and what a rerun compares against: the
same job over the same corpus must give the same shards, a different one must not mix into an old output.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from audiopipe.errors import AudiopipeError

# Where a job's shards are built (audiopipe.shard.run): auto (local processes for a small local job, Ray for a
# large one, a cluster or a codec stage), local, ray.
ENGINES = ("auto", "local", "ray")


class JobError(AudiopipeError, RuntimeError):
    """A problem the user can fix (bad arguments, an output folder from another job): printed, not traced."""


@dataclass
class CodecSettings:
    checkpoint: str | None = None
    random_init: bool = False
    seed: int = 0
    device: str = "auto"  # "auto": cuda when the worker has a GPU
    batch_size: int = 8


@dataclass
class BertSettings:
    """Per-phone BERT features for GPT-SoVITS (audiopipe.text.bert) from a local model folder."""

    checkpoint: str
    device: str = "auto"
    batch_size: int = 16


@dataclass
class Job:
    corpus: str
    out: str
    presets: list[str]
    features: list[tuple[str, dict[str, Any]]]  # (registry kind, params)
    limits: dict[str, Any]
    trim: dict[str, Any] | None = None
    phones: bool = False
    codec: CodecSettings | None = None
    align_to: str | None = None
    shard_bytes: int = 0  # 0: automatic (audiopipe.shard.plan.auto_shard_bytes)
    write_tar: bool = True
    language: str = "en"  # transcript language for phones: en (ARPAbet ids), zh or auto (GPT-SoVITS symbol ids)
    checksum: str = "xxh3_128"  # of each shard file, in its done record and the manifest (audiopipe.shard.checksum)
    # Metadata columns written as text columns beside id/speaker/text (--keep-columns): gender, original_text, ...
    keep_columns: list[str] = field(default_factory=list)
    shard_seed: int | None = 0  # utterances in a seeded random order before shards are cut (shard/plan.py); None: id order
    bert: BertSettings | None = None  # --bert-checkpoint: per-phone BERT features (zh/auto phones only)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["features"] = [[k, p] for k, p in self.features]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Job":
        d = dict(d)
        d["features"] = [(k, p) for k, p in d["features"]]
        if d.get("codec") is not None:
            d["codec"] = CodecSettings(**d["codec"])
        if d.get("bert") is not None:
            d["bert"] = BertSettings(**d["bert"])
        return Job(**d)

    def record(self) -> dict[str, Any]:
        """What the output folder keeps of the job: everything but its own location (folders can move)."""
        d = self.to_dict()
        d.pop("out")
        return d

    def identity(self) -> str:
        """Hash of everything that changes shard bytes (not the paths, so a moved corpus still resumes)."""
        d = self.to_dict()
        for k in ("corpus", "out", "checksum"):  # the checksum is not in the shards: a rerun may change it
            d.pop(k)
        if d.get("language") == "en":  # the default leaves the hash of jobs made before the field existed alone
            d.pop("language")
        if not d.get("keep_columns"):  # likewise
            d.pop("keep_columns", None)
        if d.get("shard_seed", 0) is None:  # id order: what every job did before the field existed
            d.pop("shard_seed")
        if d.get("codec"):
            d["codec"].pop("device", None)
            d["codec"].pop("batch_size", None)
        if d.get("bert"):
            d["bert"].pop("device", None)
            d["bert"].pop("batch_size", None)
        else:  # jobs made before the field existed keep their hash
            d.pop("bert", None)
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
