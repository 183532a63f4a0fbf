"""export-nemo: shards of real speech -> a NeMo JSON-lines manifest and its audio, read back the way NeMo's
manifest reader and audio loader read them; every row checked against the shards."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from audiopipe.export.errors import ExportError
from audiopipe.cli import main as cli_main
from audiopipe.export.nemo import add_arguments, export_nemo, nemo_duration, run
from audiopipe.export.staging import MARKER_NAME
from export_helpers import mixed, whole, shard_items, shard_order


def nemo_items(manifest: Path) -> list[dict]:
    """What NeMo's manifest reader (nemo.collections.common.parts.preprocessing.manifest.item_iter) makes of each
    line: audio_filepath required; duration required; text, offset, speaker, lang taken; a relative path that
    has a folder is joined to the manifest's folder, as NeMo does."""
    items = []
    for line in manifest.read_text(encoding="utf-8").splitlines():
        raw = json.loads(line)
        assert "audio_filepath" in raw and "duration" in raw, line
        audio = Path(raw["audio_filepath"])
        if not audio.is_absolute() and audio.parent != Path("."):
            audio = manifest.parent / audio
        items.append({"audio_file": str(audio), "duration": raw["duration"], "text": raw.get("text", ""),
                      "offset": raw.get("offset"), "speaker": raw.get("speaker"), "lang": raw.get("lang"),
                      "raw": raw})
    return items


def nemo_load(item: dict) -> tuple[np.ndarray, int]:
    """NeMo's AudioSegment.from_file with soundfile: seek int(offset * sr), read int(duration * sr) frames."""
    with sf.SoundFile(item["audio_file"]) as f:
        sr = f.samplerate
        if item["offset"]:
            f.seek(int(item["offset"] * sr))
        return f.read(int(item["duration"] * sr), dtype="int16"), sr


def test_manifest_and_audio_as_nemo_reads_them(mixed, tmp_path):
    out = tmp_path / "nemo"
    summary = export_nemo(mixed.shards, out)
    assert summary["audio"] == "pcm" and sorted(p.name for p in out.iterdir()) == [MARKER_NAME, "audio",
                                                                                          "manifest.json"]
    items = nemo_items(out / "manifest.json")
    shards = shard_items(mixed.shards, ("pcm",))
    order = shard_order(mixed.shards)
    assert len(items) == summary["rows"] == len(order) == len(mixed.expected)
    for uid, item in zip(order, items):  # shard order, one line per row
        e = mixed.expected[uid]
        assert (item["text"], item["speaker"], item["lang"], item["offset"]) == (e.text, e.speaker, "en", 0.0)
        assert item["raw"]["pnc"] == e.extra["pnc"]
        pcm, sr = nemo_load(item)
        assert sr == 24000 and np.array_equal(pcm, e.pcm) and np.array_equal(pcm, shards[uid]["pcm"])
        assert item["duration"] == pytest.approx(len(e.pcm) / sr, abs=1e-12)
    assert (out / "audio" / "clips" / "v0%2Ek1.wav").is_file()  # ids name files through the escaped sample key


def test_source_paths_for_whole_files_and_refusals(whole, mixed, tmp_path, capsys):
    out = tmp_path / "src"
    assert export_nemo(whole.shards, out)["audio"] == "source"  # no pcm: point at the corpus files
    assert sorted(p.name for p in out.iterdir()) == [MARKER_NAME, "manifest.json"]
    items = nemo_items(out / "manifest.json")
    shards = shard_items(whole.shards, ("fbank",))
    for uid, item in zip(shard_order(whole.shards), items):
        assert item["audio_file"] == str(whole.corpus / shards[uid]["source"])
        assert Path(item["audio_file"]).is_absolute()
        assert np.array_equal(nemo_load(item)[0], whole.expected[uid].pcm)
    bad = tmp_path / "bad"
    with pytest.raises(ExportError, match="a segment of a longer recording"):
        export_nemo(mixed.shards, bad, audio="source")
    with pytest.raises(ExportError, match="audio='pcm' needs shards that hold the pcm feature"):
        export_nemo(whole.shards, bad, audio="pcm")
    assert not bad.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(SystemExit):  # --audio none is not an option here: NeMo needs audio
        p.parse_args(["--shards", str(mixed.shards), "--out", str(bad), "--audio", "none"])
    capsys.readouterr()
    assert run(p.parse_args(["--shards", str(mixed.shards), "--out", str(out), "--overwrite", "--no-progress"])) == 0
    assert "exported 14 utterances" in capsys.readouterr().out and (out / "audio").is_dir()
    assert cli_main(["export-nemo", "--shards", str(mixed.shards), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("audiopipe: error:") and "--overwrite" in err[0]


def test_duration_reads_every_sample():
    # N / sr alone makes int(duration * sr) one sample short for some lengths; the written value never does,
    # and is the closest float above N / sr that reads them all.
    short = 0
    for sr in (16000, 22050, 24000, 44100):
        for n in range(sr, sr + 20000):
            d = nemo_duration(n, sr)
            short += int(n / sr * sr) < n
            assert int(d * sr) == n and d >= n / sr and abs(d - n / sr) < 1e-12
    assert short > 0


@pytest.mark.parametrize("command", ["export-lhotse", "export-hf", "export-nemo"])
def test_commands_are_plugged_in_and_refuse_urls(command, tmp_path, capsys, monkeypatch):
    from audiopipe.cli import main as cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli([command, "--help"])
    assert e.value.code == 0 and "--shards" in capsys.readouterr().out
    assert cli([command, "--shards", "s3://bucket/shards", "--out", "out"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ":// is not supported" in err[0] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command,package", [("export-lhotse", "lhotse"), ("export-hf", "datasets")])
def test_a_missing_package_is_one_line(command, package, tmp_path, capsys, monkeypatch):
    from audiopipe.cli import main as cli

    monkeypatch.setitem(__import__("sys").modules, package, None)  # as if it were not installed
    assert cli([command, "--shards", str(tmp_path), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"needs the {package} package: pip install" in err[0] and not (tmp_path / "o").exists()


def test_overwrite_never_deletes_a_users_own_nemo_dataset(mixed, tmp_path):
    """A NeMo dataset of the user's (manifest.json, its audio, a README) looks like an export by its manifest
    alone; --overwrite used to delete it whole. Only a folder an export wrote, holding only what it wrote, is
    replaced: the refusal names what is there."""
    mine = tmp_path / "mine"
    (mine / "wavs").mkdir(parents=True)
    (mine / "manifest.json").write_text('{"audio_filepath": "wavs/a.wav", "duration": 1.0, "text": "hi"}\n')
    (mine / "wavs" / "a.wav").write_bytes(b"RIFF")
    (mine / "README").write_text("my corpus")
    with pytest.raises(ExportError, match=f"was not written by an audiopipe NeMo export \\(no {MARKER_NAME}\\)"):
        export_nemo(mixed.shards, mine, overwrite=True)
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == ["README", "manifest.json", "wavs",
                                                                               "wavs/a.wav"]
    out = tmp_path / "exp"
    export_nemo(mixed.shards, out)
    (out / "README").write_text("notes added to an export")  # a file the export did not write
    with pytest.raises(ExportError, match=r"holds files the earlier NeMo export did not write \(README\)"):
        export_nemo(mixed.shards, out, overwrite=True)
    assert (out / "README").read_text() == "notes added to an export"
    (out / "README").unlink()
    export_nemo(mixed.shards, out, overwrite=True)  # wholly an earlier export: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp", "mine"]


def test_an_id_too_long_for_a_file_name_is_exported(tmp_path):
    """A 300-character id: its audio file name would pass the file system's 255 bytes ("System error"). The name
    is cut short with a hash of the key, and the manifest line points at it."""
    from audiopipe.shard.run import run_job
    from shard_helpers import make_job

    corpus = tmp_path / "c"
    corpus.mkdir()
    t = np.arange(16000) / 16000
    x = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype(np.int16)
    sf.write(corpus / "a.wav", x, 16000, subtype="PCM_16")
    sf.write(corpus / "b.wav", x[::-1].copy(), 16000, subtype="PCM_16")
    long_id = "x" * 300
    (corpus / "list.jsonl").write_text(json.dumps({"path": "a.wav", "id": long_id, "text": "long"}) + "\n" +
                                       json.dumps({"path": "b.wav", "id": "y" * 300, "text": "other"}) + "\n")
    shards = tmp_path / "shards"
    run_job(make_job(corpus, shards, [("pcm", {})]), workers=0, manifest=str(corpus / "list.jsonl"),
            show_progress=False)
    out = tmp_path / "nemo"
    assert export_nemo(shards, out)["rows"] == 2
    items = {i["text"]: i for i in nemo_items(out / "manifest.json")}
    names = {i["audio_file"] for i in items.values()}
    assert len(names) == 2 and all(len(Path(n).name.encode()) <= 255 for n in names)
    pcm, sr = nemo_load(items["long"])  # the shards' pcm (resampled to its rate), one second of it
    assert len(pcm) == sr and np.abs(pcm).max() > 0
