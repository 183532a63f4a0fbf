"""Never train on NaN: a shard whose feature bytes were overwritten with NaN in place (same size, so the default
open check passes) is caught by the loader's per-batch finite check and by verify="checksum"; the trainer core
stops at a non-finite loss with one line naming the batch's utterance ids (or skips up to --skip-nonfinite such
steps), never writes a checkpoint holding NaN, and --resume over a damaged or refused checkpoint falls back to
the intact one before it, in one line that never suggests unpickling code."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import torch

import core
from audiopipe.reader.errors import CorruptShardError, NonFiniteBatch
from audiopipe.reader.loader import make_loader
from reader_helpers import poison_feature
from shard_helpers import shard


@pytest.fixture(scope="module")
def clean(synthetic_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nonfinite") / "shards"
    shard(synthetic_corpus.root, out, [("vocos_mel", {})])
    return out


@pytest.fixture(scope="module")
def poisoned(clean, tmp_path_factory) -> tuple[Path, str]:
    """A copy whose first shard's first row has NaN in its mel; and that row's id."""
    out = tmp_path_factory.mktemp("poisoned") / "shards"
    shutil.copytree(clean, out)
    path = sorted((out / "arrow").glob("*.arrow"))[0]
    poison_feature(path)
    return out, str(pa.ipc.open_file(str(path)).read_all().column("id")[0])


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv1d(100, 16, 3, padding=1), torch.nn.Conv1d(16, 100, 1))


def _mse(m, b):
    x, mask = b["mel"], b["mel_mask"][:, None].float()
    return (((m(x) - x) ** 2) * mask).sum() / mask.sum(), {}


def _cfg(shards: Path, out: Path, *extra: str) -> core.RunConfig:
    cfg, _ = core.parse_args("t", argv=["--shards", str(shards), "--out", str(out), "--log-every", "1",
                                        "--warmup-steps", "1", "--batch-frames", "1200", "--max-steps", "8",
                                        "--ckpt-every", "1", *extra])
    return cfg


def _all_finite(ck: Path) -> bool:
    state = torch.load(ck, weights_only=True)["model"]
    return all(bool(torch.isfinite(t).all()) for t in state.values())


def test_the_default_loader_passes_nan_and_the_checks_catch_it(poisoned):
    shards, bad_id = poisoned
    loader = make_loader(shards, ["mel"], max_frames=100_000, rank=0, world_size=1, prefetch=0)
    loader.set_epoch(0)
    assert any(not bool(torch.isfinite(b["mel"]).all()) for b in loader)  # the size check alone lets it through
    loader = make_loader(shards, ["mel"], max_frames=100_000, rank=0, world_size=1, check_finite=True)
    loader.set_epoch(0)
    with pytest.raises(NonFiniteBatch, match=f"feature 'mel' holds NaN or inf in utterance\\(s\\) {bad_id}: "):
        list(loader)
    with pytest.raises(CorruptShardError, match="checksum"):
        make_loader(shards, ["mel"], max_frames=100_000, rank=0, world_size=1, verify="checksum")


def test_a_nan_loss_stops_the_run_naming_the_batch_and_no_nan_checkpoint_is_written(poisoned, tmp_path):
    shards, bad_id = poisoned
    with pytest.raises(SystemExit) as e:
        core.train(_model(), _mse, _cfg(shards, tmp_path), core.Dist(), features=["mel"])
    msg = str(e.value)
    assert msg.startswith("train: error: the loss is NaN or inf at step ") and bad_id in msg, msg
    assert "\n" not in msg
    cks = sorted(tmp_path.glob("ckpt-*.pt"))
    assert all(_all_finite(ck) for ck in cks)
    # The step it names was never written: every checkpoint is of a step before it.
    stopped = int(msg.split("at step ")[1].split(",")[0])
    assert all(int(ck.stem.split("-")[1]) < stopped for ck in cks)


def test_skip_nonfinite_skips_the_bad_steps_and_trains_on(poisoned, tmp_path, capsys):
    shards, bad_id = poisoned
    last = core.train(_model(), _mse, _cfg(shards, tmp_path, "--skip-nonfinite", "50"), core.Dist(),
                      features=["mel"])
    said = capsys.readouterr().out
    skipped = [line for line in said.splitlines() if "skipped step" in line]
    assert skipped and all(bad_id in line for line in skipped)
    assert last["step"] == 8 and torch.isfinite(torch.tensor(last["loss"]))
    assert all(_all_finite(ck) for ck in tmp_path.glob("ckpt-*.pt"))


def test_check_finite_and_verify_checksum_reach_the_loader_from_the_flags(poisoned, tmp_path, capsys):
    shards, bad_id = poisoned
    with pytest.raises(SystemExit):
        core.train(_model(), _mse, _cfg(shards, tmp_path / "a", "--check-finite"), core.Dist(), features=["mel"])
    err = capsys.readouterr().err
    assert f"train: error: feature 'mel' holds NaN or inf in utterance(s) {bad_id}" in err
    with pytest.raises(SystemExit) as e:
        core.train(_model(), _mse, _cfg(shards, tmp_path / "b", "--verify", "checksum"), core.Dist(),
                   features=["mel"])
    assert str(e.value).startswith("train: error: ") and "checksum" in str(e.value)


def test_a_nan_weight_is_never_checkpointed(clean, tmp_path):
    model = _model()
    with torch.no_grad():
        model[1].bias[3] = float("nan")
    loader = make_loader(clean, ["mel"], max_frames=1200, rank=0, world_size=1)
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(SystemExit) as e:
        core.save_checkpoint(tmp_path, 5, model, opt, torch.amp.GradScaler("cpu", enabled=False), loader, 0, 0,
                             core.Dist())
    assert "the weights hold NaN or inf at step 5 (first in '1.bias'): no checkpoint written" in str(e.value)
    assert not list(tmp_path.iterdir())


def test_resume_falls_back_past_a_damaged_or_refused_checkpoint_in_one_line(clean, tmp_path, capsys):
    core.train(_model(), _mse, _cfg(clean, tmp_path, "--max-steps", "3"), core.Dist(), features=["mel"])
    ck3 = tmp_path / "ckpt-00000003.pt"
    ck3.write_bytes(ck3.read_bytes()[: ck3.stat().st_size // 2])  # cut short
    capsys.readouterr()
    core.train(_model(), _mse, _cfg(clean, tmp_path, "--max-steps", "4", "--resume"), core.Dist(),
               features=["mel"])
    cap = capsys.readouterr()
    assert "--resume: ckpt-00000003.pt cannot be read" in cap.err and "using the earlier ckpt-00000002.pt" in cap.err
    assert "resumed from ckpt-00000002.pt at step 2" in cap.out

    class Payload:  # a pickle that would run code when loaded without weights_only
        def __reduce__(self):
            return (print, ("ran",))

    torch.save({"step": 9, "model": Payload()}, tmp_path / "ckpt-00000009.pt")
    for ck in tmp_path.glob("ckpt-0000000[1-4].pt"):
        ck.write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit) as e:
        core.train(_model(), _mse, _cfg(clean, tmp_path, "--max-steps", "12", "--resume"), core.Dist(),
                   features=["mel"])
    msg = str(e.value)
    assert msg.startswith("train: error: --resume: no checkpoint in ") and "\n" not in msg
    assert "ckpt-00000009.pt holds objects other than tensors" in msg
    assert "weights_only" not in msg and "weights_only" not in capsys.readouterr().err


def test_resume_of_another_models_checkpoint_is_one_line(clean, tmp_path):
    core.train(_model(), _mse, _cfg(clean, tmp_path, "--max-steps", "1"), core.Dist(), features=["mel"])
    other = torch.nn.Sequential(torch.nn.Conv1d(100, 8, 3, padding=1), torch.nn.Conv1d(8, 100, 1))
    with pytest.raises(SystemExit) as e:
        core.train(other, _mse, _cfg(clean, tmp_path, "--max-steps", "2", "--resume"), core.Dist(),
                   features=["mel"])
    assert str(e.value).startswith("train: error: --resume: ckpt-00000001.pt does not fit this model and run")
    assert "\n" not in str(e.value)


def test_two_ranks_stop_together_naming_the_bad_batch_of_whichever_rank_read_it(poisoned, tmp_path):
    """Under torchrun with 2 ranks the verdicts are all-reduced: both ranks stop at the same step, and rank 0
    names the bad utterance even when rank 1 read it; --skip-nonfinite skips on both ranks alike."""
    import os
    import sys

    from launch import run_group

    shards, bad_id = poisoned
    here = Path(__file__).resolve().parent
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(here.parent / "trainers"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(here / "core_trainer_fixture.py"), "--shards", str(shards), "--log-every", "2", "--warmup-steps", "1",
           "--batch-frames", "1200", "--max-steps", "12", "--ckpt-every", "3"]
    r = run_group(cmd + ["--out", str(tmp_path / "stop")], timeout=300, env=env)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if "the loss is NaN or inf at step" in line]
    assert len(lines) == 1 and lines[0].startswith("train: error: ") and bad_id in lines[0], r.stderr[-3000:]
    assert 'core.py", line' not in r.stderr
    assert all(_all_finite(ck) for ck in (tmp_path / "stop").glob("ckpt-*.pt"))
    r = run_group(cmd + ["--out", str(tmp_path / "skip"), "--skip-nonfinite", "100"], timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert bad_id in r.stdout and "skipped step" in r.stdout
    assert all(_all_finite(ck) for ck in (tmp_path / "skip").glob("ckpt-*.pt"))
