"""`audiopipe bench-loader` on a tiny corpus: every loader delivers the corpus, the JSON and plot are sane.

No timing is asserted: rates only have to be positive and consistent with what was delivered.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pytest
import soundfile as sf

from audiopipe.bench import loader_bench
from audiopipe.bench.loaders import LOADERS, LoaderSpec, build, f5_sort_plan, random_plan
from audiopipe.sampler.plan import BatchBudget
from reader_helpers import write_shards

BUDGET = 1500
IMPORTED = time.monotonic()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Shards of known mels plus, for the on-the-fly baseline, a 24 kHz wav per row giving the same frame count."""
    root = tmp_path_factory.mktemp("bench")
    w = write_shards(root / "shards", (4, 5, 3), seed=3, mel_frames=(30, 300))
    rng = np.random.default_rng(0)
    for r in w.rows:
        t = r["arrays"]["mel"].shape[1]
        path = root / "audio" / r["source"]
        path.parent.mkdir(parents=True, exist_ok=True)
        # vocos mel (center padding, hop 256): 1 + n // 256 frames
        sf.write(path, (0.1 * rng.standard_normal((t - 1) * 256)).astype(np.float32), 24000, subtype="PCM_16")
    return w, root


def _spec(name: str, w, root) -> LoaderSpec:
    return LoaderSpec(name, str(w.root), "mel", BUDGET, 0, 0, str(root / "cache"), str(root / "audio"))


@pytest.mark.parametrize("name", LOADERS)
def test_every_loader_delivers_the_corpus_once_per_epoch(corpus, name):
    w, root = corpus
    loader = build(_spec(name, w, root))
    lengths = np.array([r["arrays"]["mel"].shape[1] for r in w.rows])
    loader.set_epoch(0)
    seen = []
    for batch in loader:
        ids = [int(i) for i in (batch["index"] if "index" in batch else batch["id"])]
        seen += ids
        mel, got = batch["mel"], batch["mel_lengths"].numpy()
        if name == "mmap_btc":  # time-major [B, T, C]: the same values, axis for axis
            assert mel.shape[2] == 100 and mel.is_contiguous()
            mel = mel.transpose(1, 2)
        assert mel.shape[1] == 100 and mel.shape[0] == len(ids) == len(batch["duration"])
        np.testing.assert_array_equal(got, lengths[ids])  # on the fly too: the audio gives the same frames
        if name != "on_the_fly":  # the others read the stored mels, bit for bit
            for row, i in enumerate(ids):
                np.testing.assert_array_equal(mel[row, :, : lengths[i]].numpy(), w.rows[i]["arrays"]["mel"])
        if name != "f5_sort":  # F5's rule packs by the SUM of frames and may pass the padded budget
            assert mel.shape[0] * mel.shape[-1] <= BUDGET
    assert sorted(seen) == list(range(len(w.rows)))


def test_time_loader_reports_consistent_rates(corpus):
    w, root = corpus
    r = loader_bench.time_loader(_spec("mmap", w, root), seconds=0.05, min_batches=2, max_epochs=3)
    assert r["timed_batches"] >= 2 and r["timed_s"] > 0 and r["first_batch_s"] > 0
    # The batches it counted against what the plan holds: the run stopped inside its last epoch, after the
    # first batch (untimed); the utterances per batch it reports lie within the plan's batch sizes.
    loader = build(_spec("mmap", w, root))
    sizes = []
    for epoch in range(r["epochs"]):
        loader.set_epoch(epoch)
        sizes.append([len(b["id"]) for b in loader])
    assert sum(map(len, sizes[:-1])) < r["timed_batches"] + 1 <= sum(map(len, sizes))
    every = [n for epoch in sizes for n in epoch]
    assert min(every) <= r["utterances_per_s"] / r["batches_per_s"] <= max(every)
    assert r["audio_s_per_s"] > 0 and r["mb_per_s"] > 0
    # The pooled sort-and-pack plan aims at 97 % on this corpus (0.970 measured); 0.9 leaves room for the
    # partial epochs a time-boxed run ends in, and is far above what unsorted batches of it would give.
    assert r["padding_efficiency"] >= 0.9 and r["over_budget_batches"] == 0 and r["worst_padded_vs_budget"] <= 1
    assert r["peak_rss_mb"] >= r["rss_start_mb"] > 0 and r["peak_private_mb"] > 0


def test_baseline_plans_cover_every_item(corpus):
    w, _ = corpus
    lengths = np.array([r["arrays"]["mel"].shape[1] for r in w.rows])
    budget = BatchBudget(BUDGET)
    compositions = []
    for plan in (random_plan(lengths, BUDGET, 0), f5_sort_plan(lengths, BUDGET, 0)):
        b0, b1 = plan(0), plan(1)
        assert sorted(np.concatenate(b0).tolist()) == list(range(lengths.size))
        compositions.append([sorted(sorted(b.tolist()) for b in bs) for bs in (b0, b1)])
    assert compositions[0][0] != compositions[0][1]  # random: new batches every epoch
    assert compositions[1][0] == compositions[1][1]  # F5: the same batches, only their order changes
    assert all(budget.cost(b.size, lengths[b].max()) <= BUDGET for b in random_plan(lengths, BUDGET, 0)(0))
    assert all(lengths[b].sum() <= BUDGET for b in f5_sort_plan(lengths, BUDGET, 0)(0))


def test_cli_run_writes_json_table_and_plot(corpus, tmp_path, capsys, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")  # as the plot does
    import matplotlib.pyplot as plt

    closed = []  # the plot's figure, kept as it is closed, to read its legend
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (closed.append(fig), close(fig)))
    w, root = corpus
    p = argparse.ArgumentParser()
    loader_bench.add_arguments(p)
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    args = p.parse_args(["--shards", str(w.root), "--batch-frames", str(BUDGET), "--workers", "0",
                         "--seconds", "0.2", "--min-batches", "1", "--loaders", "mmap,npy_per_utt",
                         "--cache", str(root / "cache"), "--json", str(out_json), "--plot", str(out_png),
                         "--step-ms", "20", "--step-batches", "6"])
    assert loader_bench.run(args) == 0
    report = json.loads(out_json.read_text())
    assert set(report) >= {"command", "machine", "corpus", "config", "loaders", "memcpy", "ratios", "skipped"}
    assert report["machine"]["logical_cpus"] >= 1 and "torch" in report["machine"]["versions"]
    assert report["corpus"]["utterances"] == len(w.rows) and report["corpus"]["shards"] == 3
    assert [r["name"] for r in report["loaders"]] == ["mmap", "npy_per_utt"]
    for r in report["loaders"]:
        assert r["batches_per_s"] > 0 and r["mb_per_s"] > 0 and r["padding_efficiency"] >= 0.9  # same plan, both
        assert len(r["rounds"]) == 1
    # The memcpy row is the references timed in the loaders' own processes (no memcpy process of its own).
    assert report["memcpy"]["rounds"] == [r["memcpy_local_mb_per_s"] for r in report["loaders"]]
    assert report["memcpy"]["bytes"] == min(int(report["corpus"]["payload_mb"] * 1e6), 64 << 20) // 4 * 4
    t = report["ratios"]
    assert set(t) == {"mmap_vs_npy_per_utt", "mmap_vs_memcpy"}
    mmap, npy = report["loaders"]
    # Against memcpy: the copy timed in the loader's own process, just around it (not the round's memcpy).
    assert mmap["memcpy_local_mb_per_s"] > 0
    # The ratios are the bench's own quotients: checked for presence and sign, not against their formula.
    assert t["mmap_vs_memcpy"]["ratio"] > 0 and len(t["mmap_vs_memcpy"]["rounds"]) == 1
    assert t["mmap_vs_npy_per_utt"]["ratio"] > 0 and npy["audio_s_per_s"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    legend = [t.get_text() for f in closed if f is not None for lg in f.legends for t in lg.get_texts()]
    assert legend == ["audiopipe's loaders", "other loaders (baselines)", "memcpy of the same bytes",
                      "private memory (of peak RSS)"]  # what the colours and the dashed line mean
    for r in report["loaders"]:  # the data-wait loop ran its batches, each with its 20 ms step
        assert r["stepped_batches"] == 6 and r["stepped_s"] - r["data_wait_s"] >= 6 * 0.020, r
    table = capsys.readouterr().out
    assert "| mmap |" in table and "| memcpy |" in table and "mmap MB/s / memcpy MB/s" in table
    assert "of a 20 ms step |" in table
    assert "2 loader(s) x 1 round(s), 0.2 s timed each: about" in table  # the estimate, up front
    assert "target" not in table.lower() and "met" not in table.split()  # no internal goals in what it prints


def test_the_default_run_is_the_short_one_and_its_estimate_fits_90_s():
    p = argparse.ArgumentParser()
    loader_bench.add_arguments(p)
    short = p.parse_args(["--shards", "x"])
    loader_bench._defaults(short)
    assert (short.loaders, short.seconds, short.rounds) == ("mmap,npy_per_utt", 3.0, 1)
    # A 500 MB corpus whose baseline copy is still to be written: the estimate is what the docs promise.
    assert loader_bench.estimate_s(short, 2, 500.0, cache_ready=False) <= 90
    # The children's start is this process' own (imports included), which /proc tells: at least as long ago as
    # this module's import.
    assert loader_bench.own_start_s() >= time.monotonic() - IMPORTED
    full = p.parse_args(["--shards", "x", "--full", "--seconds", "5"])
    loader_bench._defaults(full)
    assert full.loaders.split(",") == list(loader_bench.LOADERS) and (full.seconds, full.rounds) == (5.0, 3)


def test_bad_arguments_are_refused_clearly(corpus, tmp_path):
    w, _ = corpus
    p = argparse.ArgumentParser()
    loader_bench.add_arguments(p)
    with pytest.raises(ValueError, match="unknown loader"):
        loader_bench.run(p.parse_args(["--shards", str(w.root), "--loaders", "mmap,nope"]))
    with pytest.raises(FileNotFoundError, match="manifest.json not found"):
        loader_bench.run(p.parse_args(["--shards", str(tmp_path)]))
    with pytest.raises(ValueError, match="no feature 'fbank'"):
        loader_bench.run(p.parse_args(["--shards", str(w.root), "--feature", "fbank"]))


def test_bench_copy_breaks_the_loader_down_per_batch(corpus, tmp_path):
    """benchmarks/bench_copy.py times the whole loader next to its stages (the breakdown docs/bench-loader.md
    describes)."""
    import subprocess
    import sys
    from pathlib import Path

    w, _ = corpus
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    out = tmp_path / "copy.json"
    subprocess.run([sys.executable, str(bench / "bench_copy.py"), "--shards", str(w.root), "--budget", str(BUDGET),
                    "--rounds", "1", "--json", str(out)], check=True, capture_output=True, text=True)
    r = {k: v["median"] for k, v in json.loads(out.read_text())["corpora"][w.root.name].items()}
    for clock in ("", "_cpu"):
        stages = [r[f"{s}{clock}_ms_per_batch"] for s in ("sampler", "rows", "collate")]
        assert r[f"loader{clock}_ms_per_batch"] > 0 and min(stages) > 0
        assert f"other{clock}_ms_per_batch" in r
    assert r["loader_vs_memcpy"] > 0 and r["memcpy_mb_per_s"] > 0 and r["bct_vs_memcpy"] > 0 and r["btc_vs_memcpy"] > 0


class _SlowLoader:
    """Batches that take a known time to arrive: the input whose data wait is known."""

    def __init__(self, delay: float, per_epoch: int):
        self.delay, self.per_epoch = delay, per_epoch

    def set_epoch(self, epoch: int) -> None:
        pass

    def __iter__(self):
        for _ in range(self.per_epoch):
            time.sleep(self.delay)
            yield {}


def test_data_wait_measures_a_known_delay_apart_from_the_step():
    w = loader_bench.data_wait(_SlowLoader(0.03, per_epoch=4), 0, step_ms=10, batches=6)
    assert w["stepped_batches"] == 6  # across two epochs: each epoch's first batch is not counted
    assert w["data_wait_s"] >= 6 * 0.03  # every counted batch blocked at least its delay
    assert w["stepped_s"] - w["data_wait_s"] >= 6 * 0.01  # and every step slept apart from it
    assert w["data_wait_share"] > 0.5  # 30 ms of waiting per 10 ms step
    fast = loader_bench.data_wait(_SlowLoader(0.0, per_epoch=4), 0, step_ms=10, batches=6)
    assert fast["data_wait_share"] < w["data_wait_share"]


def test_a_loader_with_workers_runs_in_its_forked_child(corpus, tmp_path):
    """Each loader runs in a child forked from the command's process: one with DataLoader workers forks them from
    there (a daemonic child could not)."""
    w, root = corpus
    p = argparse.ArgumentParser()
    loader_bench.add_arguments(p)
    out = tmp_path / "w1.json"
    args = p.parse_args(["--shards", str(w.root), "--batch-frames", str(BUDGET), "--workers", "1", "--seconds", "0.1",
                         "--min-batches", "1", "--loaders", "mmap", "--cache", str(root / "cache"), "--step-ms", "0",
                         "--json", str(out)])
    assert loader_bench.run(args) == 0
    (r,) = json.loads(out.read_text())["loaders"]
    assert r["workers"] == 1 and r["timed_batches"] >= 1 and r["mb_per_s"] > 0
