"""Which model a weights file holds, told by its tensor names: a trainer given another model's checkpoint says so.

Each trainer's --init-from reader knows one model family in two namings (its upstream project's and ours). Handed
another family's file, a reader used to fail deep in its converter (a missing tensor, a shape nobody expected).
`expect_family` looks at the names first, in any of the layouts the trainers read (our ckpt-*.pt and run folders,
F5's training checkpoint and .safetensors, Amphion's folder, GPT-SoVITS's .ckpt, speakerlab's files and experiment
folders), and refuses a file of another family, or of none we know, in one line: the file, what it holds, and
what the trainer starts from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from audiopipe.checkpoints.files import CheckpointError, weight_names


class ForeignCheckpoint(CheckpointError):
    """A weights file of another model family than the trainer's (or of none we know)."""


@dataclass(frozen=True)
class Family:
    display: str  # "F5-TTS"
    a: str  # its indefinite article
    starts_from: str  # what the trainer's --init-from reads, in a user's words
    markers: tuple[str, ...]  # name prefixes only this family has (either naming, wrappers removed)


FAMILIES: dict[str, Family] = {
    "f5tts": Family("F5-TTS", "an", "F5's model_*.pt or .safetensors, or a train_f5tts run or checkpoint",
                    ("transformer.blocks.", "transformer.transformer_blocks.")),
    "ns2": Family("NaturalSpeech 2", "a",
                  "Amphion's NaturalSpeech 2 checkpoint folder, or a train_ns2 run or checkpoint",
                  ("prior_encoder.", "diffusion.diff_estimator.", "wavenet.layers.")),
    "gpt_sovits": Family("GPT-SoVITS s1", "a", "GPT-SoVITS's stage-1 .ckpt, or a train_gpt_sovits run or checkpoint",
                         ("model.ar_text_embedding.", "token_pos.alpha")),
    "eres2net": Family("ERes2Net", "an", "3D-Speaker's ERes2Net file or experiment folder, or a train_eres2net run or "
                                   "checkpoint", ("fuse12.", "fuse_mode12.")),
    "campplus": Family("CAM++", "a", "3D-Speaker's CAM++ file or experiment folder, or a train_campplus run or "
                                "checkpoint", ("xvector.tdnn.", "fcm.conv1.")),
}

# Prefixes that wrap a family's names in some layouts: DDP's, F5's EMA copy, our speaker trainers' encoder.
_WRAPPERS = ("module.", "ema_model.", "encoder.")


def _names(obj: Mapping[str, Any]) -> tuple[list[str], str]:
    """The tensor names of a file's dict, unwrapped from its layout, and the layout in words."""
    if isinstance(obj.get("model"), Mapping) and "step" in obj:
        return list(obj["model"]), f"an audiopipe trainer checkpoint (step {obj['step']})"
    if isinstance(obj.get("model"), Mapping):
        return list(obj["model"]), "a checkpoint"
    if isinstance(obj.get("weight"), Mapping):
        return list(obj["weight"]), "a checkpoint"
    for key in ("ema_model_state_dict", "model_state_dict", "state_dict"):
        if isinstance(obj.get(key), Mapping):
            return list(obj[key]), "a training checkpoint"
    return list(obj), "a weights file"


def family_of(obj: Mapping[str, Any]) -> str | None:
    """The family (a FAMILIES key) whose names a file's dict holds, or None."""
    names, _ = _names(obj)
    bare = set()
    for name in map(str, names):
        while name.startswith(_WRAPPERS):
            name = name.split(".", 1)[1]
        bare.add(name)
    for fam, f in FAMILIES.items():
        if any(n.startswith(f.markers) for n in bare):
            return fam
    return None


def _weights_file(path: Path) -> Path | None:
    """The file a trainer would read for a folder (our run's latest checkpoint, Amphion's weights, speakerlab's
    embedding model), or None when the folder holds none of those."""
    if not path.is_dir():
        return path
    cks = sorted(path.glob("ckpt-*.pt"))
    if cks:
        return cks[-1]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return path / name
    exp = sorted(path.glob("models/CKPT*/embedding_model.ckpt"))
    return exp[-1] if exp else None


def expect_family(path: str | Path, family: str, trainer: str) -> None:
    """Refuse (ForeignCheckpoint, one line) a --init-from that holds another family's weights than `family`, or
    none we know. A path this cannot read (missing, damaged, refused) is left to the trainer's own reader, which
    says what is wrong with it."""
    want = FAMILIES[family]
    f = _weights_file(Path(path))
    if f is None:
        return
    try:
        obj = weight_names(f)  # names only: the trainer's own reader reads the weights once, after this
    except CheckpointError:
        return
    found = family_of(obj)
    if found == family:
        return
    names, layout = _names(obj)
    if found is None:
        shown = ", ".join(repr(str(n)) for n in names[:3]) or "no tensors"
        what = f"{layout} of no model the trainers know (its tensors: {shown}{', ...' if len(names) > 3 else ''})"
    else:
        what = f"{layout} of {FAMILIES[found].display} weights (what train_{found} reads)"
    raise ForeignCheckpoint(f"{f}: not {want.a} {want.display} checkpoint: it is {what}; "
                            f"{trainer} starts from {want.starts_from}")

