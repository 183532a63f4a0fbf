"""benchmarks/gpu_proof.py cannot rot: its quick CPU mode runs every part's code on a bundle made here, with the
modules the GPU image lacks made unimportable; a failing or hanging part never stops the others; the reader and
the trainers import without soundfile, soxr, ray, webdataset and kaldi-native-fbank."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from sysdeps import require

ROOT = Path(__file__).resolve().parent.parent
PROOF = ROOT / "benchmarks" / "gpu_proof.py"
BUNDLE = ROOT / "benchmarks" / "gpu_bundle.py"
# What the GPU image does not have (docs/gpu-proof.md). soundfile and soxr travel as wheels for the parts that
# decode audio, julius (pure Python) as a wheel for speed perturbation on the device; ray, webdataset and
# kaldi-native-fbank do not travel at all.
ABSENT = "ray,webdataset,kaldi_native_fbank"
# What the bundle reads: the English prompts and their transcripts, and the folders of gpu_bundle.VOICES
# (tests/test_skips.py checks that these packages ship those folders).
BUNDLE_DEBS = ("asterisk-core-sounds-en-wav", "asterisk-core-sounds-en", "asterisk-core-sounds-fr-wav",
               "asterisk-prompt-it-menardi-wav", "asterisk-core-sounds-it-wav", "asterisk-core-sounds-ru-wav")


def env() -> dict[str, str]:
    # One torch thread in the children, as the suite's other torch subprocesses run: beside the other test
    # process on 2 cores, two spinning OpenMP threads each cost a fifth more CPU for the same steps (the trainers
    # and f5_feeds parts of one proof: 51 s against 64 s). The cores part of the second proof sets its own.
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'trainers'}", "RAY_AUTH_MODE": "disabled",
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def test_reader_and_trainers_import_without_what_the_gpu_image_lacks():
    """Nothing on the way from shards to a training step imports soundfile, soxr, ray, webdataset or
    kaldi-native-fbank (they are made unimportable here, as they are absent there)."""
    code = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in {{'ray', 'soundfile', 'soxr', 'webdataset', 'kaldi_native_fbank'}}:
            raise ModuleNotFoundError(name, name=name)
sys.meta_path.insert(0, Block())
for m in ['core', 'train_f5tts', 'train_eres2net', 'train_campplus', 'train_gpt_sovits', 'train_ns2',
          'audiopipe.reader.loader', 'audiopipe.reader.remote_dataset', 'audiopipe.features.mel',
          'audiopipe.features.fbank', 'audiopipe.features.codec', 'audiopipe.sampler.bucket_budget',
          'calibrate_batches', 'gpu_proof', 'bench_gpu_features']:
    importlib.import_module(m)
print('imported')
"""
    e = env()
    e["PYTHONPATH"] += os.pathsep + str(ROOT / "benchmarks")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 0 and "imported" in r.stdout, r.stderr[-2000:]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """The quick bundle: a few seconds of each part's real speech, sharded here (no wheels: nothing downloads).
    Built in the bundle's own process (`--workers 0`, the same bytes): a few seconds of audio per part do not pay
    back the worker processes' start-up (18 s of CPU against 31 s with 2 workers)."""
    require(*BUNDLE_DEBS)
    out = tmp_path_factory.mktemp("gpu") / "bundle"
    r = subprocess.run([sys.executable, str(BUNDLE), "--out", str(out), "--quick", "--no-wheels", "--workers", "0"],
                       capture_output=True, text=True, env=env(), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out


def test_bundle_holds_each_parts_data_and_says_so(bundle):
    doc = json.loads((bundle / "bundle.json").read_text())
    assert set(doc["parts"]) == {"f5tts", "ns2", "gpt_sovits", "speakers"}
    for part in doc["parts"].values():
        manifest = json.loads((bundle / part["shards"] / "manifest.json").read_text())
        assert manifest["totals"]["written"] == part["files"] > 0
    # F5's own loading rule decodes the very files the f5tts shards were made from: real copies, not links.
    wavs = sorted((bundle / "wavs" / "en").rglob("*.wav"))
    assert len(wavs) == doc["parts"]["f5tts"]["files"] and not any(w.is_symlink() for w in wavs)
    speakers = json.loads((bundle / "shards" / "speakers" / "manifest.json").read_text())
    assert {f["sample_rate"] for f in speakers["features"].values()} == {16000}
    assert doc["bundle_mib"] < 16


# The trainers the rehearsal's trainers part runs: all but ERes2Net, whose main() is CAM++'s (both are
# speaker.py's flags, speaker_data's crops of the same bundle folder, core.train; only the network differs, and
# that is trained under torchrun in tests/test_train_speaker.py and sized by the calibrate part here). Leaving it
# out saves the suite its slowest trainer run (~20 s of 2-core time; ~45 s on a loaded machine).
REHEARSED = ("f5tts", "campplus", "gpt_sovits", "ns2")


@pytest.mark.slow
def test_quick_proof_runs_every_part_on_cpu(bundle, tmp_path):
    """The whole proof on the CPU (slow: ~2.5 min on 2 cores; it is the only run of the GPU script's code here)."""
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(PROOF), "--bundle", str(bundle), "--out", str(out), "--work",
                        str(tmp_path / "work"), "--device", "cpu", "--quick", "--without", ABSENT,
                        "--trainers", ",".join(REHEARSED)], capture_output=True, text=True, env=env(), timeout=900)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    doc = json.loads((out / "gpu_proof.json").read_text())
    parts = doc["parts"]
    assert list(parts) == ["cuda_tests", "trainers", "f5_feeds", "prefetch_probe", "features", "calibrate"]
    assert all(p["status"] == "ok" and 0 < p["seconds"] <= p["cap_s"] for p in parts.values())
    assert sum(p["seconds"] for p in parts.values()) < wall
    assert doc["device"]["device"] == "cpu" and doc["device"]["torch"] and doc["without"] == ABSENT

    tests = {t["test"]: t for t in parts["cuda_tests"]["tests"]}
    assert len(tests) == 8 and not [t for t in tests.values() if t["outcome"] == "failed"]
    for name in ("test_bf16_autocast_step_through_core", "test_fp16_gradscaler_skips_an_overflowing_step_and_backs_off",
                 "test_prefetch_delivers_device_tensors_equal_to_the_cpu_path",
                 "test_core_clock_measures_an_injected_delay_as_data_wait",
                 "test_encodec_batched_on_device_equals_one_at_a_time"):
        assert tests[name]["outcome"] == "passed", tests[name]
    assert all(t["message"] for t in tests.values() if t["outcome"] == "skipped")  # every skip says why

    trainers = parts["trainers"]["trainers"]
    assert list(trainers) == list(REHEARSED)
    for name, t in trainers.items():
        assert t["status"] == "ok", (name, t)
        for run in (t["prefetch_2"], t["prefetch_0"]):
            assert run["timed_steps"] == 2 and run["step_ms"] > 0 and run["frames_per_s"] > 0, (name, run)
            assert 0 <= run["data_wait_share"] < 1 and 0 <= run["padding_share"] < 1
            assert run["argv"][run["argv"].index("--prefetch") + 1] == ("2" if run is t["prefetch_2"] else "0")

    feeds = parts["f5_feeds"]
    for k in ("on_device", "audiopipe", "f5_own_rule"):
        assert feeds[k]["timed_steps"] == 2 and feeds[k]["loss_finite"] and feeds[k]["frames_per_s"] > 0
        assert 0 <= feeds[k]["data_wait_share"] < 1

    probe = parts["prefetch_probe"]
    feeds_probed = [k for k, v in probe.items() if isinstance(v, dict) and "step_ms" in v]
    assert feeds_probed == ["cold", "off", "thread_copy", "thread_build", "workers", "thread_copy_switch"]
    assert probe["same_batches"] is True  # every feed trained on the same frames, so the rows compare
    assert all(probe[k]["loss_finite"] and probe[k]["thread_cpu_ms_per_step"] > 0 for k in feeds_probed)
    assert all(probe[k]["timed_steps"] == 2 and probe[k]["frames"] > 0 and 0 <= probe[k]["data_wait_share"] < 1
               for k in feeds_probed)

    summary = parts["features"]["summary"]
    for f in ("mel", "fbank"):
        assert summary[f"{f} batch 4"]["parity"]["max_abs_diff"] <= 1e-5
    assert summary["codec batch 4"]["parity"]["codes_equal"] == 1.0

    from audiopipe.sampler.bucket import BucketBatchSampler
    from audiopipe.sampler.bucket_budget import BucketBudget

    f5 = BucketBudget.read(out / "bucket_budget_f5tts.json")
    assert len(f5.buckets) == 2 and f5.source["device"].startswith("cpu")
    lengths = np.arange(95, 1853)
    assert all(len(b) <= f5.capacities(lengths[b].max()) for b in BucketBatchSampler(lengths, f5, seed=0))
    cmp = parts["calibrate"]["f5tts"]["compare"]
    assert cmp["global_max_frames"] == min(b.max_frames for b in f5.buckets) and cmp["gain"] > 0
    assert BucketBudget.read(out / "bucket_budget_eres2net.json").buckets[0].max_len == 16000

    files = sorted(p.name for p in out.iterdir())
    assert files == ["bucket_budget_eres2net.json", "bucket_budget_f5tts.json", "gpu_proof.json", "gpu_proof.log"]
    log = (out / "gpu_proof.log").read_text()
    assert "torch " + doc["device"]["torch"] in log and "6/6 parts ok" in log
    assert all(f"part {p}: ok in" in log for p in parts)
    # The tables for the docs name the machine, and say when they are no GPU figure.
    t = subprocess.run([sys.executable, str(PROOF), "--tables", str(out / "gpu_proof.json")], capture_output=True,
                       text=True, env=env(), timeout=120)
    assert t.returncode == 0 and "CPU rehearsal, --quick: not a GPU figure" in t.stdout
    assert all(f"| {name} |" in t.stdout for name in trainers)
    assert all(page in t.stdout for page in ("docs/trainers/f5tts.md", "docs/extraction.md", "docs/sampler.md"))


def test_a_failing_part_does_not_stop_the_others(bundle, tmp_path):
    """Without its audio the features part fails with its reason; the CUDA tests still run (and skip the tests
    that need speech, saying so), and the run exits 1 with both results written."""
    broken = tmp_path / "bundle"
    shutil.copytree(bundle, broken, ignore=shutil.ignore_patterns("wavs"))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(PROOF), "--bundle", str(broken), "--out", str(out), "--work",
                        str(tmp_path / "work"), "--device", "cpu", "--quick", "--parts", "features,cuda_tests",
                        "--without", ABSENT], capture_output=True, text=True, env=env(), timeout=300)
    assert r.returncode == 1, r.stdout[-3000:]
    doc = json.loads((out / "gpu_proof.json").read_text())
    assert list(doc["parts"]) == ["cuda_tests", "features"]  # run in the order of value, not as listed
    assert doc["parts"]["features"]["status"] == "failed"
    assert "no audio files" in doc["parts"]["features"]["error"]
    cuda = doc["parts"]["cuda_tests"]
    assert cuda["status"] == "ok" and cuda["counts"]["failed"] == 0 and cuda["counts"]["passed"] >= 1
    assert any("no real speech" in t["message"] for t in cuda["tests"] if t["outcome"] == "skipped")
    assert "part features: failed" in (out / "gpu_proof.log").read_text()


def test_a_device_that_cannot_be_read_is_written_down_and_the_parts_still_run(bundle, tmp_path):
    """The device is read in a child (the parent holds no CUDA context); when that child fails, the run says
    why in the JSON and the log and goes on to the parts, each of which records its own outcome."""
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(PROOF), "--bundle", str(bundle), "--out", str(out), "--work",
                        str(tmp_path / "work"), "--device", "cpu", "--quick", "--parts", "features",
                        "--without", "torch"], capture_output=True, text=True, env=env(), timeout=120)
    assert r.returncode == 1, r.stdout[-3000:]
    doc = json.loads((out / "gpu_proof.json").read_text())
    assert "No module named 'torch'" in doc["device"]["error"]
    assert doc["parts"]["features"]["status"] == "failed"
    assert "device not read" in (out / "gpu_proof.log").read_text()


def test_a_part_past_its_cap_is_stopped_with_its_processes(bundle, tmp_path):
    sys.path.insert(0, str(PROOF.parent))
    import gpu_proof

    work = tmp_path / "work"
    work.mkdir()
    a = argparse.Namespace(bundle=bundle, out=tmp_path, work=work, device="cpu", without="", quick=True,
                           trainers="f5tts", env=env())
    t0 = time.monotonic()
    res = gpu_proof.run_child(a, "trainer", 1.0, extra=["--trainer", "f5tts"])  # no trainer starts in a second
    assert res["status"] == "timeout" and res["exit"] is None and time.monotonic() - t0 < 10
    assert "output_tail" in res
    ps = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True)
    assert ps.stdout.strip() == ""  # the child and anything it started are gone


def test_a_timeout_ends_that_group_and_the_ones_it_started_not_its_parents(tmp_path):
    sys.path.insert(0, str(PROOF.parent))
    import gpu_proof

    procs = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(3)]
    try:
        (tmp_path / "process_groups").write_text("".join(f"{p.pid}\n" for p in procs))
        gpu_proof.kill_groups(tmp_path, since=procs[1].pid)  # the middle one timed out; the last is its child
        assert [p.wait(timeout=10) for p in procs[1:]] == [-9, -9]
        assert procs[0].poll() is None  # the part that started it runs on
        assert (tmp_path / "process_groups").read_text().split() == [str(procs[0].pid)]
    finally:
        procs[0].kill()
        procs[0].wait()


def test_refuses_a_missing_bundle_and_unknown_parts(tmp_path, capsys):
    """The script's own argument checks, run in this process (a subprocess each would import torch again)."""
    sys.path.insert(0, str(PROOF.parent))
    import gpu_proof

    base = ["--bundle", str(tmp_path), "--out", str(tmp_path / "o"), "--device", "cpu"]
    for extra, says in (([], "has no bundle.json"), (["--parts", "trainers,warp"], "unknown part(s) warp"),
                        (["--trainers", "f5tts,warp"], "unknown trainer(s) warp")):
        with pytest.raises(SystemExit) as e:
            gpu_proof.main(base + extra)
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err, err
        if not extra:
            assert "make gpu-bundle" in err
    assert not (tmp_path / "o").exists()  # refused before anything was written


@pytest.mark.slow
def test_quick_round_two_runs_every_part_on_cpu(bundle, tmp_path):
    """benchmarks/gpu_proof2.py (full batches mid-epoch, the cores F5-TTS's and ERes2Net's feeds need, equal-length
    features, budgets that hold) on the CPU, on the same quick bundle, with what the GPU image lacks made
    unimportable. Its trainers keep the one thread env() gives them (core.setup_dist follows OMP_NUM_THREADS)."""
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_proof2.py"), "--bundle", str(bundle), "--out",
                        str(out), "--work", str(tmp_path / "work"), "--device", "cpu", "--quick", "--without", ABSENT],
                       capture_output=True, text=True, env=env(), timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_proof2.json", "gpu_proof2.log"]
    doc = json.loads((out / "gpu_proof2.json").read_text())
    parts = doc["parts"]
    assert list(parts) == ["full_batches", "cores", "speaker_cores", "features", "calibrate", "speakers", "shapes"]
    assert all(p["status"] == "ok" and 0 < p["seconds"] <= p["cap_s"] for p in parts.values())

    full = parts["full_batches"]
    assert full["copies"] >= 2 and full["batches_per_epoch"] >= 5 and full["mid_epoch"]["steps"] == 2
    assert 0 < full["mid_epoch"]["mean_frames"] <= full["batch_frames"]
    edge = [s["epoch_index"] for s in full["boundary"]["per_step"]]
    assert edge == [[0, full["batches_per_epoch"] - 1], [1, 0]]  # the steps on each side of the epoch's end

    # The cores sweeps: one pinned core on a CPU (the sweep's code, once), both feeds on the same batches.
    for name, feeds in (("cores", ("audiopipe", "f5_own_rule")), ("speaker_cores", ("audiopipe", "speakerlab_rule"))):
        cores = parts[name]
        assert list(cores["by_cores"]) == ["1"] and len(cores["by_cores"]["1"]["cpus"]) == 1
        for feed in feeds:
            row = cores["by_cores"]["1"][feed]
            assert row["steps"] == 2 and row["vs_on_device"] > 0 and 0 <= row["data_wait_share"] < 1
        assert set(cores["fewest_cores_within"]) == set(feeds)
    rule = parts["speaker_cores"]["rule_per_item"]
    assert rule["crop_s"] == 1.0 and rule["decoded_s"] > 1.0  # whole files, longer than the crop, decoded per item
    assert parts["speaker_cores"]["on_device_features"]["steps"] == 2

    summary = parts["features"]["summary"]
    for f in ("mel", "fbank", "codec"):
        equal = summary[f"{f} equal batch 2"]
        assert equal["padding_efficiency"] == 1.0
        assert (equal["parity"]["codes_equal"] == 1.0 if f == "codec" else equal["parity"]["max_abs_diff"] <= 1e-5)

    holds = parts["calibrate"]["holds"]
    assert holds["no_out_of_memory"] and holds["margin"] == 0.1 and holds["frames_per_s_gain"] > 0
    speakers = parts["speakers"]
    assert set(speakers["eres2net"]) == {"device", "cpu"} and set(speakers["campplus"]) == {"device"}
    for run in (*speakers["eres2net"].values(), speakers["campplus"]["device"]):
        assert run["timed_steps"] == 2 and run["step_ms"] > 0 and 0 <= run["data_wait_share"] < 1
    f5 = parts["shapes"]["f5tts"]
    for key in ("eager", "eager_shapes", "compiled_shapes"):
        assert f5[key]["steps"] == 3 and f5[key]["first_seen_steps"] + f5[key]["repeated_steps"] == 3
    assert f5["eager_shapes"]["shapes_met"] <= 8 and f5["compiled_vs_eager_shapes"] > 0
    gpt = parts["shapes"]["gpt_sovits"]  # eager with --shapes (compiling is left to the GPU: minutes on a CPU)
    assert set(gpt) == {"eager_shapes"} and gpt["eager_shapes"]["timed_steps"] == 2
    assert "7/7 parts ok" in (out / "gpu_proof2.log").read_text()
