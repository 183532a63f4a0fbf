"""Model weight files: read without running code from them, written atomically.

A checkpoint downloaded from the internet is untrusted input. A `.pt` / `.pth` / `.ckpt` / `.bin` file is a pickle,
and unpickling an arbitrary pickle can run any code, so torch files are read only with
`torch.load(weights_only=True)`: tensors, numbers, strings and plain containers come back, anything else (a class,
a function, a call) is refused in one line that names what the file asked for. `.safetensors` holds no code at all
and is preferred wherever the upstream project publishes it.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any, Mapping

import torch

from audiopipe.errors import AudiopipeError
from audiopipe.storage.atomic import atomic_path

TORCH_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"


class CheckpointError(AudiopipeError, ValueError):
    """A weights file that cannot be used as asked; the message is one line that says why and what to do."""


def _refusal_reason(err: Exception) -> str:
    """The one informative line of torch's weights_only refusal (it names the global the pickle asked for)."""
    text = str(err)
    m = re.search(r"(unsupported GLOBAL [^\n]*|Unsupported global: [^\n]*|Unsupported operand [^\n]*)", text,
                  re.IGNORECASE)
    line = m.group(1) if m else next((s for s in text.splitlines() if s.strip()), type(err).__name__)
    return line.strip().rstrip(".")


def read_weights(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """The dictionary stored in a weights file: {name: tensor} from `.safetensors`, or whatever (nested) dict of
    tensors and plain values a torch file holds. Tensors are on the CPU.

    mmap: map a torch file's tensors instead of reading them (a look at names or shapes costs no read of the
    weights; a file in torch's legacy format, which cannot be mapped, is read whole).

    Raises CheckpointError (one line) for a missing or unreadable file, a file that is not a dict, and a torch
    file that holds Python objects beyond tensors and plain containers (it is refused, never unpickled).
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such file")
    if p.is_dir():
        raise CheckpointError(f"{p} is a folder: give the weights file inside it")
    if not p.is_file():
        raise CheckpointError(f"{p} is not a regular file")
    suffix = p.suffix.lower()
    if suffix == SAFETENSORS_SUFFIX:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return dict(load_file(str(p), device="cpu"))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{p}: not a readable safetensors file ({e})") from None
    if suffix not in TORCH_SUFFIXES:
        raise CheckpointError(f"{p}: unknown weights file type {suffix or '(none)'!r}; expected .safetensors or "
                              f"one of {', '.join(TORCH_SUFFIXES)}")
    try:
        obj = _torch_load(p, mmap)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{p}: refused: the file holds Python objects beyond tensors and plain containers "
            f"({_refusal_reason(e)}), and checkpoints are never fully unpickled since that can run code; re-save "
            f"its weights alone (torch.save(model.state_dict(), ...)) or use the .safetensors file where one is "
            f"published") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        first = next((s for s in str(e).splitlines() if s.strip()), type(e).__name__)
        raise CheckpointError(f"{p}: not a readable torch checkpoint ({first.strip()})") from None
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{p}: holds a {type(obj).__name__}, not a dictionary of weights")
    return dict(obj)


def _torch_load(p: Path, mmap: bool) -> Any:
    if mmap and zipfile.is_zipfile(p):  # only the zip format maps; the legacy one is read whole
        return torch.load(p, map_location="cpu", weights_only=True, mmap=True)
    return torch.load(p, map_location="cpu", weights_only=True)


def weight_names(path: str | Path) -> dict[str, Any]:
    """A weights file's dictionary for a look at its names and plain values, without reading the weights: a
    `.safetensors` file's names from its header (values None), a torch file mapped (read_weights(mmap=True))."""
    p = Path(path)
    if p.suffix.lower() != SAFETENSORS_SUFFIX or not p.is_file():
        return read_weights(p, mmap=True)
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(p), framework="pt", device="cpu") as f:
            return dict.fromkeys(f.keys())
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{p}: not a readable safetensors file ({e})") from None


def tensors_only(state: Mapping[str, Any], where: str) -> dict[str, torch.Tensor]:
    """A state dict's tensors, refusing one that holds anything else (a nested training checkpoint given where a
    plain state dict was expected)."""
    bad = [k for k, v in state.items() if not torch.is_tensor(v)]
    if bad:
        raise CheckpointError(f"{where}: expected a state dict of tensors, but {len(bad)} entries are not tensors "
                              f"(e.g. {bad[0]!r})")
    return dict(state)


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: str | Path,
                      metadata: Mapping[str, str] | None = None) -> Path:
    """Write {name: tensor} as `.safetensors`, atomically. Tensors that share storage (tied weights) are written as
    copies, which safetensors requires."""
    from safetensors.torch import save_file

    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    with atomic_path(Path(path)) as tmp:
        save_file(plain, str(tmp), metadata=dict(metadata) if metadata else None)
    return Path(path)


def write_torch(obj: Mapping[str, Any], path: str | Path) -> Path:
    """torch.save of a dict of tensors and plain values, atomically (readable with weights_only=True)."""
    with atomic_path(Path(path)) as tmp:
        torch.save(dict(obj), tmp)
    return Path(path)


def run_checkpoint(path: str | Path, give: str = "a run folder or a checkpoint file") -> Path:
    """The checkpoint file `path` names: the file itself, or a trainer run folder's latest ckpt-*.pt (the names
    sort by step)."""
    p = Path(path)
    if p.is_dir():
        cks = sorted(p.glob("ckpt-*.pt"))
        if not cks:
            raise CheckpointError(f"{p}: a folder without ckpt-*.pt; give {give}")
        p = cks[-1]
    return p
