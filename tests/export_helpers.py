"""Shard sets of real speech for the exporter tests, built once per test session and shared by test_export_*.py.

`mixed`: long recordings cut by NeMo segments (offset + duration) and whole clips, one of them with a dot in
its id, with pcm (24 kHz, the corpus rate: the shards hold the expected samples exactly), the Kaldi fbank, the
vocos mel and the energy (a 1-D feature), `language` and `pnc` kept, in several shards. `whole`: the clips alone, fbank only (no pcm), so
an export points at the corpus files. Each comes with the expected rows {id: Expect}.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from audiopipe.cli import main
from audiopipe.reader.arrow_dataset import ShardDataset
from corpora_en import Expect, make_long, write

FEATURES = "pcm,fbank,mel,energy"


@dataclass
class Built:
    corpus: Path
    shards: Path
    expected: dict[str, Expect]


def _clips(root: Path, pool) -> tuple[list[dict], dict[str, Expect]]:
    rows, expected = [], {}
    for v, clips in enumerate(pool):
        for k, clip in enumerate(clips[2:4]):
            uid = f"clips/v{v}.k{k}" if (v, k) == (0, 1) else f"clips/v{v}_k{k}"
            pcm = write(root / "clips" / f"v{v}_k{k}.wav", clip.pcm)
            rows.append({"id": uid, "audio_filepath": f"clips/v{v}_k{k}.wav", "text": clip.text,
                         "speaker": f"talker{v}", "lang": "en", "pnc": "no"})
            expected[uid] = Expect(f"talker{v}", clip.text, pcm, {"language": "en", "pnc": "no"})
    return rows, expected


def _write_manifest(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _build(base: Path, pool, name: str) -> Built:
    root, out = base / f"{name}_corpus", base / f"{name}_shards"
    done = base / f"{name}.done"
    if done.exists():
        return Built(root, out, _expected_of(root))
    root.mkdir(parents=True, exist_ok=True)
    clip_rows, expected = _clips(root, pool)
    args = ["shard", "--workers", "2", "--no-progress", "--out", str(out), "--shard-size", "600KB",
            "--keep-columns", "language,pnc"]
    if name == "mixed":
        _, segs = make_long(root, pool)
        seg_rows = [{"id": s.id, "audio_filepath": str(s.path.relative_to(root)), "offset": round(s.start, 3),
                     "duration": round(s.duration, 3), "text": s.text, "speaker": s.speaker, "lang": "en",
                     "pnc": "yes"} for s in segs]
        expected.update({s.id: Expect(s.speaker, s.text, s.pcm, {"language": "en", "pnc": "yes"}) for s in segs})
        _write_manifest(root / "segments.json", seg_rows)
        _write_manifest(root / "clips.json", clip_rows)
        args += ["--manifest", str(root / "segments.json"), "--manifest", str(root / "clips.json"),
                 "--features", FEATURES]
    else:
        _write_manifest(root / "clips.json", clip_rows)
        args += ["--manifest", str(root / "clips.json"), "--features", "fbank"]
    assert main(args) == 0
    np.savez(root / "expected.npz", **{f"{k}|{e.speaker}|{e.text}|{e.extra['pnc']}": e.pcm
                                       for k, e in expected.items()})
    done.write_text("ok")
    return Built(root, out, expected)


def _expected_of(root: Path) -> dict[str, Expect]:
    with np.load(root / "expected.npz") as z:
        out = {}
        for key in z.files:
            uid, speaker, text, pnc = key.split("|")
            out[uid] = Expect(speaker, text, z[key], {"language": "en", "pnc": pnc})
        return out


def built(tmp_path_factory: pytest.TempPathFactory, pool, name: str) -> Built:
    """The `mixed` or `whole` shard set (module docstring), built on first use in this session's temp folder."""
    base = tmp_path_factory.getbasetemp() / "export_shards"
    base.mkdir(exist_ok=True)
    return _build(base, pool, name)


def shard_items(shards: Path, features: tuple[str, ...]) -> dict[str, dict]:
    """{id: item} as audiopipe's own reader gives them, arrays copied out of the mapping."""
    ds = ShardDataset(shards, list(features), meta_columns=("id", "speaker", "text", "source", "duration",
                                                            "language", "pnc"))
    return {it["id"]: {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in it.items()}
            for it in (ds[i] for i in range(len(ds)))}


def shard_order(shards: Path) -> list[str]:
    ds = ShardDataset(shards, [], meta_columns=("id",))
    return [ds[i]["id"] for i in range(len(ds))]


def webdataset_samples(shards: Path) -> dict[str, dict]:
    """The shards' WebDataset tars read by webdataset itself: {id: {"json", "pcm" (int16, from the FLAC),
    "<feature>": array from its .npy}}, an oracle for the shards' content that shares no code with our reader."""
    import webdataset as wds

    m = json.loads((shards / "manifest.json").read_text())
    urls = [str(shards / e["tar"]["path"]) for e in m["shards"]]
    out = {}
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        meta = json.loads(sample["json"])
        item = {"json": meta}
        for key, value in sample.items():
            if key == "flac":
                item["pcm"] = sf.read(io.BytesIO(value), dtype="int16")[0]
            elif key.endswith(".npy"):
                item[key[:-4]] = np.load(io.BytesIO(value), allow_pickle=False)
        out[meta["id"]] = item
    return out


def tar_names(path: Path) -> list[str]:
    with tarfile.open(path) as t:
        return t.getnames()


# The two shard sets (module docstring) as fixtures: a test module imports them by name; each is built once per
# session and handed out once per module.
@pytest.fixture(scope="module")
def mixed(tmp_path_factory, speech_pool):
    return built(tmp_path_factory, speech_pool, "mixed")


@pytest.fixture(scope="module")
def whole(tmp_path_factory, speech_pool):
    return built(tmp_path_factory, speech_pool, "whole")
