"""audiopipe.checkpoints: weight files are read without running code from them, written atomically, and loaded
into a model with a report of what matched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from audiopipe.checkpoints.files import CheckpointError, read_weights, write_safetensors, write_torch
from audiopipe.checkpoints.load import ShapeMismatch, load_matching


class _Evil:
    """A pickle that runs a shell command when loaded without weights_only: it would create `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_pickle_is_refused_in_one_line_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "model.ckpt"
    torch.save({"weight": torch.zeros(2), "payload": _Evil(marker)}, path)
    with pytest.raises(CheckpointError) as e:
        read_weights(path)
    msg = str(e.value)
    assert "\n" not in msg and "refused" in msg and "system" in msg  # names what the pickle asked for
    assert not marker.exists()


def test_safetensors_and_torch_files_round_trip(tmp_path):
    state = {"a.weight": torch.randn(3, 4), "b": torch.arange(5)}
    tied = {**state, "c": state["a.weight"]}  # shared storage: safetensors needs copies
    st = write_safetensors(tied, tmp_path / "m.safetensors", metadata={"format": "pt"})
    pt = write_torch({"model": state, "step": 7, "info": "x"}, tmp_path / "m.pt")
    back = read_weights(st)
    assert set(back) == {"a.weight", "b", "c"} and all(torch.equal(back[k], tied[k]) for k in back)
    obj = read_weights(pt)
    assert obj["step"] == 7 and torch.equal(obj["model"]["b"], state["b"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


@pytest.mark.parametrize("make, says", [
    (lambda p: None, "no such file"),
    (lambda p: p.write_bytes(b"PK\x03\x04 truncated"), "not a readable torch checkpoint"),
    (lambda p: torch.save([torch.zeros(1)], p), "not a dictionary"),
], ids=["missing", "truncated", "a-list"])
def test_unusable_torch_files_are_one_line_errors(tmp_path, make, says):
    path = tmp_path / "w.pt"
    make(path)
    with pytest.raises(CheckpointError, match=says) as e:
        read_weights(path)
    assert "\n" not in str(e.value)


def test_a_damaged_safetensors_and_an_unknown_suffix_are_refused(tmp_path):
    bad = tmp_path / "w.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        read_weights(bad)
    (tmp_path / "w.onnx").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="unknown weights file type"):
        read_weights(tmp_path / "w.onnx")


def test_load_matching_loads_reports_and_refuses_shape_mismatch():
    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    dst = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3), torch.nn.Linear(3, 2))
    state = {**src.state_dict(), "extra.buffer": torch.zeros(1)}
    r = load_matching(dst, state)
    assert r.loaded == ["0.weight", "0.bias", "1.weight", "1.bias"] and r.new == ["2.weight", "2.bias"]
    assert r.dropped == ["extra.buffer"] and r.loaded_values == 4 * 8 + 8 + 8 * 3 + 3
    assert torch.equal(dst[1].weight, src[1].weight)
    assert "loaded 4 tensors" in r.summary() and "new (kept as initialised): 2" in r.summary()
    wrong = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 5))
    before = wrong[0].weight.clone()
    with pytest.raises(ShapeMismatch, match=r"'1.weight' is \[3, 8\] in the checkpoint but \[5, 8\].*--vocab"):
        load_matching(wrong, state, hints={"1.": "give --vocab with the checkpoint's vocab.txt"})
    assert torch.equal(wrong[0].weight, before)  # nothing is loaded when any tensor mismatches


def _mapped_file(address: int) -> str | None:
    """The file behind the memory mapping that holds `address` in this process, or None (anonymous memory)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= address < hi:
            return parts[5] if len(parts) == 6 else None
    return None


def test_weight_names_looks_at_names_without_reading_the_weights(tmp_path):
    from safetensors.torch import save_file

    from audiopipe.checkpoints.files import weight_names

    zipped = tmp_path / "ckpt.pt"
    torch.save({"model": {"a.weight": torch.ones(1 << 16)}, "step": 7}, zipped)
    got = weight_names(zipped)
    assert got["step"] == 7 and list(got["model"]) == ["a.weight"]
    # the tensor is a view of the file, mapped: none of its bytes were read into the process's own memory
    assert _mapped_file(got["model"]["a.weight"].data_ptr()) == str(zipped)
    assert _mapped_file(read_weights(zipped)["model"]["a.weight"].data_ptr()) != str(zipped)

    legacy = tmp_path / "old.pt"  # torch's legacy format cannot be mapped: read whole, same answer
    torch.save({"b": torch.zeros(2)}, legacy, _use_new_zipfile_serialization=False)
    assert list(weight_names(legacy)) == ["b"]

    st = tmp_path / "model.safetensors"  # names from the header alone
    save_file({"w": torch.ones(2), "v": torch.zeros(3)}, st)
    assert weight_names(st) == {"v": None, "w": None}
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        weight_names(tmp_path / "bad.safetensors")
