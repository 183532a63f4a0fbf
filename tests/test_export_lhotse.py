"""export-lhotse: shards of real speech -> lhotse Shar, read back by lhotse itself (CutSet.from_shar, load_audio,
load_<feature>, DynamicBucketingSampler, its collate functions) and checked row by row against the shards (our
reader and webdataset's); Kaldi fbank against lhotse's Fbank, measured; refusals and atomic output."""

from __future__ import annotations

import argparse
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from audiopipe.decode.audio import resample_to
from audiopipe.export.errors import ExportError
from audiopipe.cli import main as cli_main
from audiopipe.export.lhotse import add_arguments, export_lhotse, run
from audiopipe.features.fbank import KaldiFbank
from export_helpers import mixed, whole, shard_items, shard_order, webdataset_samples

lhotse = pytest.importorskip("lhotse")
from lhotse import CutSet  # noqa: E402
from lhotse.array import Array, TemporalArray  # noqa: E402

SR = 24000


@pytest.fixture(scope="module")
def shar(mixed, tmp_path_factory):
    out = tmp_path_factory.mktemp("lhotse_export") / "shar"
    return out, export_lhotse(mixed.shards, out)


def _cuts(path) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(CutSet.from_shar(in_dir=str(path)))


def test_every_cut_holds_the_shards_audio_arrays_text_and_speaker(mixed, shar):
    out, summary = shar
    cuts = _cuts(out)
    items = shard_items(mixed.shards, ("pcm", "fbank", "mel", "energy"))
    wds = webdataset_samples(mixed.shards)
    manifest = json.loads((mixed.shards / "manifest.json").read_text())
    assert len(manifest["shards"]) > 1 and summary["shar_shards"] == len(manifest["shards"])
    assert len(list(out.glob("cuts.*.jsonl.gz"))) == len(list(out.glob("recording.*.tar"))) == len(manifest["shards"])
    assert [c.id for c in cuts] == shard_order(mixed.shards)  # shard order, every row once
    assert summary["rows"] == len(cuts) == len(mixed.expected) == len(wds)
    for cut in cuts:
        e, it, w = mixed.expected[cut.id], items[cut.id], wds[cut.id]
        sup = cut.supervisions[0]
        assert (sup.text, sup.speaker, sup.language, sup.custom) == (e.text, e.speaker, "en", {"pnc": e.extra["pnc"]})
        assert (sup.start, sup.duration, cut.start, cut.duration) == (0, cut.duration, 0, len(e.pcm) / SR)
        audio = cut.load_audio()
        assert audio.shape == (1, len(e.pcm)) and cut.recording.sampling_rate == SR
        pcm = np.rint(audio[0].astype(np.float64) * 32768).astype(np.int16)
        assert np.array_equal(pcm, e.pcm) and np.array_equal(pcm, it["pcm"]) and np.array_equal(pcm, w["pcm"])
        assert isinstance(cut.fbank, TemporalArray) and cut.fbank.frame_shift == 0.01
        assert isinstance(cut.mel, Array) and not isinstance(cut.mel, TemporalArray)
        for name in ("fbank", "mel", "energy"):
            got = cut.load_custom(name)  # lhotse's own read, time first
            assert got.dtype == np.float32 and got.shape == it[name].T.shape
            assert np.array_equal(got, it[name].T) and np.array_equal(got, w[name].T)
        assert cut.energy.shape == [len(it["energy"])]
    assert {c.id for c in cuts if "." in c.id} == {"clips/v0.k1"}


def test_lhotse_samplers_and_collation_over_the_export(shar):
    from lhotse.dataset import DynamicBucketingSampler
    from lhotse.dataset.collation import collate_audio, collate_custom_field, collate_matrices

    out, _ = shar
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cuts = CutSet.from_shar(in_dir=str(out))
        sampler = DynamicBucketingSampler(cuts, max_duration=8.0, num_buckets=2, shuffle=True, seed=3)
        batches = [list(b) for b in sampler]
    every = _cuts(out)
    seen = [c.id for b in batches for c in b]
    assert sorted(seen) == sorted(c.id for c in every) and len(seen) == len(set(seen))  # each cut exactly once
    assert len(batches) > 1 and all(sum(c.duration for c in b) <= 8.0 for b in batches)
    batch = CutSet.from_cuts(batches[0])
    audio, audio_lens = collate_audio(batch)
    fbank, fbank_lens = collate_custom_field(batch, "fbank", pad_value=0.0)
    mels = collate_matrices([c.load_mel() for c in batch])
    for i, cut in enumerate(batch):
        assert int(audio_lens[i]) == cut.num_samples
        assert np.array_equal(audio[i, :cut.num_samples].numpy(), cut.load_audio()[0])
        n = int(fbank_lens[i])
        assert np.array_equal(fbank[i, :n].numpy(), cut.load_fbank()) and n == cut.fbank.shape[0]
        assert np.array_equal(mels[i, :cut.mel.shape[0]].numpy(), cut.load_mel())


def test_kaldi_fbank_against_lhotse_fbank(mixed):
    """What docs/export.md states: audiopipe's kaldi_fbank is lhotse's Fbank(snip_edges=True, high_freq=0.0),
    and lhotse's default Fbank differs in frame count (2 more) and values."""
    from lhotse.features.kaldi.extractors import Fbank, FbankConfig

    items = shard_items(mixed.shards, ("pcm", "fbank"))
    ours = KaldiFbank()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lhotse warns that snip_edges=True breaks its frame arithmetic
        same = Fbank(FbankConfig(snip_edges=True, high_freq=0.0))
        default = Fbank()
        worst_same, default_max = 0.0, []
        for it in items.values():
            # The 16 kHz waveform the shard job fed the fbank: the 24 kHz samples through the same resampler.
            wav = resample_to(it["pcm"].astype(np.float32) / 32768, SR, [16000])[16000]
            assert np.array_equal(ours(wav)["fbank"], it["fbank"])  # the shards hold exactly this
            n = len(wav)
            a = it["fbank"].T
            b = same.extract(wav, 16000)
            assert b.shape == a.shape == (1 + (n - 400) // 160, 80)
            worst_same = max(worst_same, float(np.abs(a - b).max()))
            c = default.extract(wav, 16000)
            assert c.shape[0] == a.shape[0] + 2 == (n + 80) // 160  # lhotse: round(N / 160) frames
            default_max.append(float(np.abs(a - c[:len(a)]).max()))
    assert worst_same < 5e-3  # float32 rounding: 1.6e-3 at most on this speech (docs/export.md)
    assert min(default_max) > 1.0


def test_audio_from_the_corpus_files_or_none(whole, mixed, tmp_path):
    out = tmp_path / "src"
    summary = export_lhotse(whole.shards, out)  # no pcm in these shards: auto points at the corpus files
    assert summary["audio"] == "source" and not list(out.glob("recording.*"))
    items = shard_items(whole.shards, ("fbank",))
    for cut in _cuts(out):
        e = whole.expected[cut.id]
        src = cut.recording.sources[0]
        assert src.type == "file" and src.source == str(whole.corpus / items[cut.id]["source"])
        pcm = np.rint(cut.load_audio()[0].astype(np.float64) * 32768).astype(np.int16)
        assert np.array_equal(pcm, e.pcm) and cut.supervisions[0].text == e.text
        assert np.array_equal(cut.load_fbank(), items[cut.id]["fbank"].T)
    none = tmp_path / "none"
    assert export_lhotse(mixed.shards, none, audio="none", features=["fbank"])["audio"] == "none"
    cuts = _cuts(none)
    assert not any(c.has_recording for c in cuts) and sorted(p.name.split(".")[0] for p in none.iterdir()) == \
        sorted(["cuts", "fbank"] * len(list(none.glob("cuts.*"))))
    items = shard_items(mixed.shards, ("fbank",))
    for cut in cuts:  # without audio, a cut lasts the shards' duration
        assert cut.duration == pytest.approx(items[cut.id]["duration"]) and cut.load_fbank().shape[1] == 80


def test_refusals_are_one_line_and_leave_nothing(mixed, whole, tmp_path, capsys):
    out = tmp_path / "x"
    with pytest.raises(ExportError, match=r"has no feature codes \(it has pcm, fbank, mel, energy\)"):
        export_lhotse(mixed.shards, out, features=["codes"])
    with pytest.raises(ExportError, match="audio='pcm' needs shards that hold the pcm feature"):
        export_lhotse(whole.shards, out, audio="pcm")
    # Segments of long recordings cannot point at their files: refused at the first such row, mid-export,
    # and the staged folder goes with it.
    with pytest.raises(ExportError, match=r"utterance 'rec0-0' cannot point at .*rec0\.wav: the row is .* \(a "
                                          r"segment of a longer recording\); use audio=\'pcm\'"):
        export_lhotse(mixed.shards, out, audio="source")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with pytest.raises(ExportError, match="not found"):
        export_lhotse(tmp_path / "nowhere", out)
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert cli_main(["export-lhotse", "--shards", str(mixed.shards), "--out", str(out), "--features", "nope", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("audiopipe: error:") and "no feature nope" in err[0]


def test_overwrite_only_replaces_an_earlier_export(mixed, tmp_path, capsys):
    out = tmp_path / "shar"
    out.mkdir()  # an empty folder made for it is fine
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert run(p.parse_args(["--shards", str(mixed.shards), "--out", str(out), "--features", "fbank",
                             "--no-progress"])) == 0
    assert "exported 14 cuts" in capsys.readouterr().out
    with pytest.raises(ExportError, match="pass overwrite=True"):
        export_lhotse(mixed.shards, out)
    export_lhotse(mixed.shards, out, overwrite=True, audio="none", features=["mel"])
    assert not list(out.glob("fbank.*")) and list(out.glob("mel.*")) and not list(out.glob("recording.*"))
    # No temporaries, no old copy left; the marker lies beside the folder (lhotse reads every file in it).
    assert sorted(p.name for p in tmp_path.iterdir()) == [".shar.audiopipe-export.json", "shar"]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="does not look like a lhotse Shar export"):
        export_lhotse(mixed.shards, other, overwrite=True)
    assert (other / "keep.txt").read_text() == "mine"


def test_pcm_export_never_loads_torchaudio(mixed, tmp_path):
    """With every extra installed, torchcrepe pulls in a torchaudio built for another torch, whose library fails
    to load (`_torchaudio.so`); lhotse's default backend took torchaudio for the FLAC and the export failed. A
    torchaudio that fails to import the same way is first on the path here: the export writes with soundfile."""
    import subprocess
    import sys

    broken = tmp_path / "site" / "torchaudio"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise OSError('_torchaudio.so: undefined symbol (built for another torch)')\n")
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "shar"
    r = subprocess.run([sys.executable, "-m", "audiopipe.cli", "export-lhotse", "--shards", str(mixed.shards),
                        "--out", str(out), "--audio", "pcm", "--no-progress"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(root)])},
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(out.glob("recording.*.tar")) and len(_cuts(out)) == 14
