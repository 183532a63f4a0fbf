"""trainers/core.py: two ranks under real torchrun with dropout, checkpoint, bit-exact resume, resume under another
world size, the two epochs that can never give an optimizer step (one-line errors, not an endless loop), atomic
checkpoints, log sums kept on the device, and the --prefetch hand-over to make_loader."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from launch import run_group
import core
from shard_helpers import shard

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FIXTURE = HERE / "core_trainer_fixture.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
# The fixture imports core by name, as the trainers in trainers/ do.
ENV = dict(os.environ, OMP_NUM_THREADS="1",
           PYTHONPATH=os.pathsep.join([str(ROOT / "trainers"), *filter(None, [os.environ.get("PYTHONPATH")])]))


@pytest.fixture(scope="module")
def mel_shards(synthetic_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("core_shards")
    shard(synthetic_corpus.root, out, [("vocos_mel", {})])
    return out


def _args(shards: Path, out: Path, *extra: str) -> list[str]:
    return ["--shards", str(shards), "--out", str(out), "--log-every", "1", "--warmup-steps", "2", "--lr", "1e-3",
            "--batch-frames", "1200", "--max-steps", "6", *extra]


def _launch(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return run_group(cmd, timeout=timeout, env=ENV)


def _run(shards: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    r = _launch(TORCHRUN + [str(FIXTURE), *_args(shards, out, *extra)])
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(mel_shards, tmp_path_factory) -> Path:
    """One straight 2-rank run of 6 steps that also checkpoints at step 3."""
    out = tmp_path_factory.mktemp("straight")
    _run(mel_shards, out, "--ckpt-every", "3")
    return out


def _rank0_padding(shards: Path, steps: int) -> list[float]:
    """Rank 0's padding ratio per batch, epoch after epoch, from the loader the fixture's core builds."""
    from audiopipe.reader.loader import make_loader

    loader = make_loader(shards, ["mel"], max_frames=1200, seed=1234, rank=0, world_size=2)
    out: list[float] = []
    for epoch in range(steps):
        loader.set_epoch(epoch)
        out += [float(b["padding_ratio"]["mel"]) for b in loader]
        if len(out) >= steps:
            return out[:steps]
    raise AssertionError("the plan never gave enough batches")


def test_two_rank_resume_is_bit_exact_with_dropout(mel_shards, straight, tmp_path):
    """A run that crashed after logging step 6 but before its checkpoint 6 was written, resumed in the same
    folder: steps 4-6 are trained again exactly, and the log holds every step once (it used to get 4-6 twice)."""
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "ckpt-00000003.pt").write_bytes((straight / "ckpt-00000003.pt").read_bytes())
    (resumed / "log.jsonl").write_text((straight / "log.jsonl").read_text())
    _run(mel_shards, resumed, "--ckpt-every", "3", "--resume")
    a = torch.load(straight / "ckpt-00000006.pt", weights_only=True)
    b = torch.load(resumed / "ckpt-00000006.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert len(b["rng"]) == 2 and not torch.equal(b["rng"][0]["torch"], b["rng"][1]["torch"])
    log, first = _log(resumed), _log(straight)
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in log[3:]] == [r["loss"] for r in first[3:]]
    for rec in first:
        assert rec["world"] == 2  # the data-wait share: test_data_wait_* below
        assert rec["step_time"] > 0 and rec["frames_per_s"] > 0
    # The logged padding is rank 0's batch of that step (one batch a step here), as the same plan pads it.
    assert [r["padding_ratio"] for r in first] == pytest.approx(_rank0_padding(mel_shards, len(first)))
    assert sorted(p.name for p in straight.iterdir()) == ["ckpt-00000003.pt", "ckpt-00000006.pt", "log.jsonl"]


def test_resume_under_another_world_size_draws_what_the_step_draws(mel_shards, straight, tmp_path, monkeypatch,
                                                                   capsys):
    """The 2-rank checkpoint of step 3 resumed by a world of one (the fixture script run in this process): rank
    0's random draws in steps 4-6 are those of the straight run's rank 0, a function of (seed, rank, step) only.
    Before the fix the resumed rank was seeded as at step 0 and drew again what the run drew in its first step."""
    import runpy

    (tmp_path / "ckpt-00000003.pt").write_bytes((straight / "ckpt-00000003.pt").read_bytes())
    monkeypatch.setattr(sys, "argv", [str(FIXTURE), *_args(mel_shards, tmp_path, "--ckpt-every", "3", "--resume")])
    runpy.run_path(str(FIXTURE), run_name="__main__")
    assert "resumed from ckpt-00000003.pt at step 3" in capsys.readouterr().out
    resumed, first = _log(tmp_path), _log(straight)
    assert [x["step"] for x in resumed] == [4, 5, 6] and all(x["world"] == 1 for x in resumed)
    assert [x["u"] for x in resumed] == [x["u"] for x in first[3:]]
    assert resumed[0]["u"] != first[0]["u"]
    assert len({x["u"] for x in first}) == 6  # every step its own stream


@pytest.mark.parametrize("flags, says", [
    (("--batch-frames", "40"), "epoch 0 has no batch: every one of the 12 utterances is longer than the "
                               "--batch-frames budget of 40"),
    (("--grad-accum", "1000"), "but --grad-accum is 1000, so no optimizer step is ever taken"),
], ids=["no-batch", "grad-accum"])
def test_an_epoch_without_a_step_ends_with_one_line(mel_shards, tmp_path, flags, says):
    """Both used to loop forever, silently. Now every rank stops at once, and rank 0 says why and what to
    change, in one line, with no traceback of ours."""
    t0 = time.perf_counter()
    r = _launch(TORCHRUN + [str(FIXTURE), *_args(mel_shards, tmp_path, *flags)], timeout=240)
    took = time.perf_counter() - t0
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if says in line]
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("train: error: ") and ("raise --batch-frames" in lines[0] or
                                                      "use --grad-accum" in lines[0])
    assert 'core.py", line' not in r.stderr, r.stderr[-3000:]
    assert not (tmp_path / "log.jsonl").exists()
    assert took < 120, f"took {took:.0f} s"


def test_a_failed_checkpoint_write_leaves_nothing(mel_shards, tmp_path):
    """Checkpoints go through audiopipe.storage.atomic: a save that fails midway leaves neither a checkpoint
    nor a temporary (the old tmp + replace left `ckpt-*.tmp` behind)."""
    loader = core.make_loader(mel_shards, ["mel"], max_frames=1200, rank=0, world_size=1)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    with pytest.raises(Exception):
        core.save_checkpoint(tmp_path, 1, model, opt, scaler, loader, 0, 0, core.Dist(),
                             extra={"unpicklable": lambda: None})
    assert list(tmp_path.iterdir()) == []
    path = core.save_checkpoint(tmp_path, 2, model, opt, scaler, loader, 0, 0, core.Dist())
    assert list(tmp_path.iterdir()) == [path] and core.latest_checkpoint(tmp_path) == path
    assert torch.load(path, weights_only=True)["step"] == 2


def _recording_mse(seen: list[float], wrap=lambda t: t):
    """A 1x1-conv mel autoencoder and its loss, which records every micro-batch's loss in `seen` and returns
    the loss and a term `half` (loss / 2) dressed by `wrap`."""
    torch.manual_seed(0)
    model = torch.nn.Conv1d(100, 100, 1)

    def loss_fn(m, b):
        x, mask = b["mel"], b["mel_mask"][:, None].float()
        loss = (((m(x) - x) ** 2) * mask).sum() / mask.sum()
        seen.append(float(loss.detach()))
        return wrap(loss), {"half": wrap(loss.detach() / 2)}

    return model, loss_fn


class _Counted(torch.Tensor):
    """A loss that counts how often the loop reads it back to the host."""

    reads = 0

    def __float__(self):
        _Counted.reads += 1
        return super().__float__()

    def item(self):
        _Counted.reads += 1
        return super().item()


def test_loss_and_terms_are_read_back_only_at_log_lines(mel_shards, tmp_path):
    """4 steps x 2 micro-batches, a log line every 2 steps: the loss and one term are read twice each (once per
    log line), where the old loop read both after every micro-batch (8 times each)."""
    # All 8 micro-batches inside epoch 0, so no partial accumulation is dropped at an epoch end.
    frames = next(f for f in (600, 500, 400, 300) if len(_epoch0(mel_shards, f)) >= 8)
    cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--max-steps", "4", "--log-every", "2",
                                               "--grad-accum", "2", "--batch-frames", str(frames),
                                               "--ckpt-every", "100"))
    seen = []
    _Counted.reads = 0
    last = core.train(*_recording_mse(seen, lambda t: t.as_subclass(_Counted)), cfg, core.Dist(), features=["mel"])
    assert len(seen) == 8 and _Counted.reads == 2 * 2
    logs = _log(tmp_path)
    assert [r["step"] for r in logs] == [2, 4]
    assert logs[-1]["loss"] == pytest.approx(sum(seen[4:]) / 4, rel=1e-6)  # mean per step of the window
    assert logs[-1]["half"] == pytest.approx(sum(seen[4:]) / 8, rel=1e-6)  # terms: mean per micro-batch
    assert last == logs[-1]


def _epoch0(shards, frames: int):
    probe = core.make_loader(shards, ["mel"], max_frames=frames, seed=1234, rank=0, world_size=1)
    probe.set_epoch(0)
    return probe


def test_prefetch_reaches_the_loader(mel_shards, tmp_path):
    """--prefetch (default 2) goes to make_loader together with the device: the real loader builds ahead."""
    cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--prefetch", "3"))
    loader = core._make_loader(cfg, core.Dist(), ["mel"], None, None, {}, tmp_path)
    assert (loader.prefetch, loader.device) == (3, torch.device("cpu"))
    assert len(loader) > 0 and next(iter(loader))["mel"].device == torch.device("cpu")
    assert core.parse_args("t", argv=_args(mel_shards, tmp_path))[0].prefetch == 2
    with pytest.raises(SystemExit):
        core.parse_args("t", argv=["--prefetch", "-1"])
    # --prefetch 0 is off: no background thread (make_loader given a device would still build one batch ahead).
    cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--prefetch", "0"))
    loader = core._make_loader(cfg, core.Dist(), ["mel"], None, None, {}, tmp_path)
    assert (loader.prefetch, loader.device) == (0, None)
    assert type(iter(loader)).__name__ != "PrefetchIterator"


def test_a_dropped_partial_accumulation_is_not_logged(mel_shards, tmp_path):
    """An epoch of an odd number of batches under --grad-accum 2 ends with one micro-batch that is never
    stepped on. The logged loss is the mean over the micro-batches that were trained on; the old loop also
    summed the dropped one into the window (and divided by the steps taken)."""
    for frames in (600, 800, 1000, 1200, 1500, 2000, 2500):
        n = len(_epoch0(mel_shards, frames))
        if n % 2 == 1 and n >= 3:
            break
    else:
        pytest.skip("no budget gives an odd number of batches on this corpus")
    steps = (n - 1) // 2 + 1  # every full pair of epoch 0, then the first step of epoch 1
    cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--max-steps", str(steps), "--log-every", "100",
                                               "--grad-accum", "2", "--batch-frames", str(frames),
                                               "--ckpt-every", "100"))
    seen = []
    last = core.train(*_recording_mse(seen), cfg, core.Dist(), features=["mel"])
    assert len(seen) == n + 2 and last["step"] == steps and last["epoch"] == 1
    trained = seen[:n - 1] + seen[n:]  # micro-batch n - 1 (0-based) of epoch 0 was dropped
    assert last["loss"] == pytest.approx(sum(trained) / 2 / steps, rel=1e-6)
    assert last["loss"] != pytest.approx(sum(seen) / 2 / steps, rel=1e-6)


def _fixture_model(hidden: int = 32) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv1d(100, hidden, 3, padding=1), torch.nn.Dropout(0.3),
                               torch.nn.Conv1d(hidden, 100, 1))


def _mse(m, b):
    x, mask = b["mel"], b["mel_mask"][:, None].float()
    return (((m(x) - x) ** 2) * mask).sum() / mask.sum(), {}


def test_init_from_our_checkpoint_and_a_mismatch(mel_shards, straight, tmp_path, capsys):
    """--init-from a ckpt-*.pt (or its run folder) loads the weights and says what it loaded; with --lr 0 the
    first step leaves them as they were. Another model size ends in one line naming the tensor and both shapes."""
    ck = torch.load(straight / "ckpt-00000003.pt", weights_only=True)["model"]
    for src in (straight / "ckpt-00000003.pt", straight):
        cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path / src.name, "--max-steps", "1", "--lr", "0",
                                                   "--weight-decay", "0", "--init-from", str(src)))
        model = _fixture_model()
        core.train(model, _mse, cfg, core.Dist(), features=["mel"])
        latest = torch.load(straight / "ckpt-00000006.pt", weights_only=True)["model"]
        expect = ck if src.suffix == ".pt" else latest
        assert all(torch.equal(model.state_dict()[k], expect[k]) for k in expect)
        said = capsys.readouterr().out
        assert f"--init-from {src}: loaded 4 tensors" in said and "dropped (not in this model): none" in said
    cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path / "wrong", "--init-from",
                                               str(straight / "ckpt-00000003.pt")))
    with pytest.raises(SystemExit) as e:
        core.train(_fixture_model(hidden=16), _mse, cfg, core.Dist(), features=["mel"])
    assert str(e.value).startswith("train: error: --init-from tensor '0.weight' is [32, 100, 3] in the "
                                   "checkpoint but [16, 100, 3] in this model")


class _CountingHook:
    """Counts the optimizer steps it saw; its count travels in the checkpoint."""

    name = "counter"

    def __init__(self):
        self.count, self.started = 0, None

    def on_start(self, model, resumed):
        self.started = resumed

    def after_step(self, step, model):
        self.count += 1
        assert step == self.count or self.started  # steps arrive in order, from 1 (or from the resumed step)

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def test_hooks_run_each_step_and_resume_with_their_state(mel_shards, tmp_path):
    first = _CountingHook()
    cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--max-steps", "3", "--ckpt-every", "3"))
    core.train(_fixture_model(), _mse, cfg, core.Dist(), features=["mel"], hooks=[first])
    assert first.count == 3 and first.started is False
    assert torch.load(tmp_path / "ckpt-00000003.pt", weights_only=True)["hooks"] == {"counter": {"count": 3}}
    again = _CountingHook()
    cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--max-steps", "5", "--resume"))
    core.train(_fixture_model(), _mse, cfg, core.Dist(), features=["mel"], hooks=[again],
               lr_fn=lambda s: 0.5 ** s)
    assert again.count == 5 and again.started is True
    assert [r["lr"] for r in _log(tmp_path)][-2:] == [0.5 ** 3, 0.5 ** 4]  # the schedule given, per step


@pytest.mark.parametrize("flag, value", [("--precision", "fp8"), ("--reader", "npy"), ("--on-corrupt", "ignore")])
def test_a_choice_flag_refuses_a_bad_value(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        core.parse_args("t", argv=[flag, value])
    assert e.value.code == 2 and f"invalid choice: '{value}'" in capsys.readouterr().err


def _delayed_run(shards: Path, out: Path, prefetch: int, delay_s: float, step_s: float) -> list[dict]:
    """A world-of-one run whose every batch takes `delay_s` longer to build (a batch_transform that blocks, as
    a slow reader would) and whose every step takes `step_s` longer (a sleep in the loss, releasing the GIL as a
    GPU step does). All its steps lie in epoch 0, so only the pass's first batch starts unprepared."""
    frames = next(f for f in (600, 500, 400, 300) if len(_epoch0(shards, f)) >= 5)
    built = []

    def slow_batch(batch):
        time.sleep(delay_s)  # the injected build time, the quantity under test
        built.append(1)
        return batch

    def slow_step(m, b):
        time.sleep(step_s)  # the injected step time
        return _mse(m, b)

    cfg, _ = core.parse_args("t", argv=_args(shards, out, "--max-steps", "5", "--log-every", "1", "--batch-frames",
                                               str(frames), "--ckpt-every", "100", "--prefetch", str(prefetch)))
    core.train(_fixture_model(), slow_step, cfg, core.Dist(), features=["mel"],
               loader_kw={"batch_transform": slow_batch})
    log = _log(out)
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5] and len(built) >= 5
    return log


def test_data_wait_without_prefetch_is_the_injected_build_time(mel_shards, tmp_path, one_torch_thread):
    """Batches built on the training thread (--prefetch 0): every step waits for its batch's injected 0.3 s and
    spends the injected 0.3 s of its own besides. So the logged wait is at least the delay and the rest of the
    step at least the step's sleep: the share lies between delay / step time (what the delay alone explains) and
    1 - step sleep / step time, an interval around one half that only overheads (the batch's copy, the model, a
    busy machine) widen. A wait not timed, or a step timed as part of the wait, falls outside it."""
    delay = step = 0.3
    log = _delayed_run(mel_shards, tmp_path, 0, delay, step)
    for r in log:
        assert r["data_wait"] >= delay and r["step_time"] - r["data_wait"] >= step, r
        assert delay / r["step_time"] <= r["data_wait_share"] <= 1 - step / r["step_time"], r
    # The interval says something: in the quickest step, overheads were under half of it.
    assert min(r["step_time"] for r in log) < 2 * (delay + step), log


def test_data_wait_with_prefetch_hides_a_build_shorter_than_the_step(mel_shards, tmp_path, one_torch_thread):
    """The same 0.05 s build delay under --prefetch 2 and a 0.2 s step: the thread builds the next batch while
    the step sleeps, so from the second step on the loop no longer waits for the delay. The pass's first batch
    was never built ahead of the loop and is waited for (all but the moment before the loop's clock starts)."""
    delay, step = 0.05, 0.2
    log = _delayed_run(mel_shards, tmp_path, 2, delay, step)
    # The clock does see a wait where there is one. Not the whole delay: the look-ahead thread starts building
    # the first batch when the loader is made, a moment before the loop starts its clock.
    assert log[0]["data_wait"] >= delay / 2
    later = log[1:]
    mean_wait = sum(r["data_wait"] for r in later) / len(later)
    # Far below what building on the training thread costs (>= delay on every step, the test above). Not zero:
    # on a busy machine the thread may wait for a core after its build, so no bound per step.
    assert mean_wait < delay / 2, later
    assert all(r["step_time"] >= step for r in later)


def test_compile_at_fixed_shapes_trains_the_eager_losses(mel_shards, tmp_path):
    """--shapes 2 --compile: torch.compile (inductor, compiled with gcc) of a small conv model gives, step by step,
    the losses eager mode gives within float tolerance. Every batch has one of the sampler's 2 shapes, and the
    log carries each window's fill (padded frames over the budget)."""
    runs = {}
    for mode in ("eager", "compile"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv1d(100, 32, 3, padding=1), torch.nn.GELU(),
                                    torch.nn.Conv1d(32, 100, 1))
        shapes = []

        def loss_fn(m, b):
            shapes.append((b["mel"].shape[0], b["mel"].shape[-1]))
            return _mse(m, b)

        out = tmp_path / mode
        cfg, _ = core.parse_args("t", argv=_args(mel_shards, out, "--max-steps", "4", "--shapes", "2",
                                                 "--ckpt-every", "100", *(["--compile"] if mode == "compile" else [])))
        assert cfg.compile == (mode == "compile") and cfg.shapes == 2
        core.train(model, loss_fn, cfg, core.Dist(), features=["mel"])
        runs[mode] = (_log(out), shapes)
    (eager, shapes), (comp, _) = runs["eager"], runs["compile"]
    loader = core._make_loader(cfg, core.Dist(), ["mel"], None, None, {}, tmp_path)
    allowed = set(zip(loader.sampler.shapes.sizes, loader.sampler.shapes.edges))
    assert len(allowed) <= 2 and set(shapes) <= allowed and len(shapes) == 4
    assert np.allclose([r["loss"] for r in comp], [r["loss"] for r in eager], rtol=1e-4, atol=1e-6)
    assert all(r["fill"] == pytest.approx(s[0] * s[1] / 1200) for r, s in zip(eager, shapes))


@pytest.mark.parametrize("name", ["train_f5tts", "train_ns2", "train_gpt_sovits", "train_eres2net",
                                  "train_campplus"])
def test_shards_not_a_shard_folder_and_out_a_file_are_one_line(name, mel_shards, tmp_path, capsys):
    """Every trainer, given a --shards folder without a manifest (a typo, the corpus instead of its shards), says
    so in one argparse line before reading anything, whichever folder of a mix it is; and an --out that is a
    file, the same way."""
    main = importlib.import_module(name).main
    for shards in (tmp_path / "nope", f"{mel_shards},{tmp_path}"):
        with pytest.raises(SystemExit) as e:
            main(["--shards", str(shards), "--out", str(tmp_path / "run"), "--max-steps", "1"])
        err = capsys.readouterr().err.strip().splitlines()
        bad = str(shards).split(",")[-1]
        assert e.value.code == 2 and err[-1].endswith(f"error: --shards {bad}: no manifest.json there, so not a "
                                                      f"shard folder (write one with `audiopipe shard --corpus ... "
                                                      f"--out {bad}`)"), err
        assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "run").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as e:
        main(["--shards", str(mel_shards), "--out", str(tmp_path / "file"), "--max-steps", "1"])
    assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(
        f"error: --out {tmp_path / 'file'} is a file: give the folder the run writes its log and checkpoints to")


def test_resume_with_no_checkpoint_yet_says_it_starts_at_step_0(mel_shards, tmp_path, capsys):
    """A job script that always passes --resume: its first run finds no checkpoint, says so and trains from 0."""
    model = torch.nn.Sequential(torch.nn.Conv1d(100, 100, 1))
    cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--resume", "--max-steps", "2"))
    last = core.train(model, _mse, cfg, core.Dist(), features=["mel"], log_name="t")
    assert f"[t] --resume: no checkpoint in {tmp_path} yet; starting at step 0" in capsys.readouterr().out
    assert last["step"] == 2 and [r["step"] for r in _log(tmp_path)] == [1, 2]


def test_profile_steps_record_the_steps_after_the_first_window(mel_shards, tmp_path, capsys):
    """--profile-steps 2 --log-every 2: steps 3-4 recorded (the first window is the warm-up), profile.json says
    what a step costs and which ops cost it, profile.txt holds torch's table; a run too short for the window is
    refused in one line. On a CPU there is no kernel or host-wait count (the CUDA test covers the device)."""
    model = torch.nn.Sequential(torch.nn.Conv1d(100, 32, 3, padding=1), torch.nn.GELU(), torch.nn.Conv1d(32, 100, 1))
    cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--log-every", "2", "--profile-steps", "2"))
    core.train(model, _mse, cfg, core.Dist(), features=["mel"])
    prof = json.loads((tmp_path / "profile.json").read_text())
    assert prof["steps"] == 2 and prof["first_step"] == 3 and prof["device"] == "cpu" and prof["wall_ms"] > 0
    assert prof["kernels"] is None and prof["host_waits"] is None
    names = [row[0] for row in prof["top_host_ms"]]
    assert "aten::convolution_backward" in names and prof["ops"] > 20  # two convolutions, forward and backward
    assert "aten::convolution" in (tmp_path / "profile.txt").read_text()
    assert "[profile] steps 3-4:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        core.parse_args("t", argv=_args(mel_shards, tmp_path, "--profile-steps", "6"))
    assert e.value.code == 2 and "--max-steps must be at least --log-every + --profile-steps (1 + 6)" in \
        capsys.readouterr().err


def test_passes_follow_the_corpus_size_by_default_and_the_log_says_so(mel_shards, tmp_path, capsys):
    """--passes 0 (the default) plans several passes an epoch on the 12 utterances (fewer than 4 batches of
    1200 frames), and rank 0 says how many, the batches and the planned fill; --passes 1 keeps one pass and says
    its fill and the flag; a budget that one pass fills plans one pass and says nothing."""
    cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path))
    assert cfg.passes == 0
    loader = core._make_loader(cfg, core.Dist(), ["mel"], None, None, {}, tmp_path)
    d = loader.sampler.diagnostics
    assert loader.sampler.passes > 1 and d.fill_ratio > 0.8, d.summary()
    capsys.readouterr()
    core.say_passes(loader, cfg, "t")
    budgets = loader.sampler.lengths.sum() / 1200
    assert budgets < 4 and capsys.readouterr().out == (
        f"[t] 12 utterances, {budgets:.1f} batches of frames: an epoch is {loader.sampler.passes} passes over them "
        f"(--passes 0: by corpus size), {d.batches_per_rank} batches per rank an epoch, planned fill "
        f"{d.fill_ratio:.0%} of the budget\n")
    one_cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--passes", "1"))
    one = core._make_loader(one_cfg, core.Dist(), ["mel"], None, None, {}, tmp_path)
    core.say_passes(one, one_cfg, "t")
    said = capsys.readouterr().out
    assert one.sampler.passes == 1 and one.sampler.diagnostics.fill_ratio < d.fill_ratio
    assert f"{budgets:.1f} batches of frames, one pass an epoch: {one.sampler.diagnostics.batches_per_rank} " \
        f"batches per rank" in said
    assert "--passes 0 (by corpus size) plans several passes an epoch with full batches" in said
    longest = int(loader.sampler.lengths.max())
    big_cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--batch-frames", str(longest)))
    big = core._make_loader(big_cfg, core.Dist(), ["mel"], None, None, {}, tmp_path)
    core.say_passes(big, big_cfg, "t")
    # a budget of the longest utterance: 4 batches of frames or more, and one pass fills them over half
    assert big.sampler.lengths.sum() >= 4 * longest and big.sampler.one_pass_frame_fill() >= 0.5
    assert big.sampler.passes == 1 and capsys.readouterr().out == ""
    # with an item cap, the line also counts the corpus in batches of items, and the plan's fill of that cap
    cap_cfg, _ = core.parse_args("t", argv=_args(mel_shards, tmp_path, "--batch-frames", "120000", "--max-items", "4"))
    capped = core._make_loader(cap_cfg, core.Dist(), ["mel"], None, None, {}, tmp_path)
    core.say_passes(capped, cap_cfg, "t")
    cd = capped.sampler.diagnostics
    said = capsys.readouterr().out
    assert capped.sampler.passes > 1 and "12 utterances" in said and ", 3.0 batches of 4 items:" in said, said
    assert f"and {cd.kept / cd.num_batches / 4:.0%} of the 4-item cap\n" in said and cd.kept / cd.num_batches > 3.5
