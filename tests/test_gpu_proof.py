"""benchmarks/gpu_proof.py cannot rot: its quick CPU mode runs every part's code once on a bundle made here, with
the modules the GPU image lacks made unimportable; a failing or hanging part never stops the others; the reader and
the trainers import without soundfile, soxr, ray, webdataset and kaldi-native-fbank; and the pieces that decide
what it measures (the bundle's re-sliced speech, equal-length feature batches, the grown corpus, 3D-Speaker's rule)
do what they say."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest
from sysdeps import require

ROOT = Path(__file__).resolve().parent.parent
PROOF = ROOT / "benchmarks" / "gpu_proof.py"
BUNDLE = ROOT / "benchmarks" / "gpu_bundle.py"
for p in (ROOT / "benchmarks", ROOT / "trainers"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
# What the GPU image does not have (docs/gpu-proof.md). soundfile and soxr travel as wheels for the parts that
# decode audio, julius (pure Python) as a wheel for speed perturbation on the device; ray, webdataset and
# kaldi-native-fbank do not travel at all.
ABSENT = "ray,webdataset,kaldi_native_fbank"
# What the bundle reads: the English prompts and their transcripts, and the folders of gpu_bundle.VOICES
# (tests/test_skips.py checks that these packages ship those folders).
BUNDLE_DEBS = ("asterisk-core-sounds-en-wav", "asterisk-core-sounds-en", "asterisk-core-sounds-fr-wav",
               "asterisk-prompt-it-menardi-wav", "asterisk-core-sounds-it-wav", "asterisk-core-sounds-ru-wav")
# The trainers part's rehearsal: F5-TTS. Every trainer goes through the same run_main, which the rehearsal also
# runs for ERes2Net and CAM++ (`speakers`) and GPT-SoVITS (`shapes`); each trainer's main() has its own tests.
REHEARSED = ("f5tts",)


def env() -> dict[str, str]:
    # One torch thread in the children, as the suite's other torch subprocesses run: beside the other test
    # process on 2 cores, two spinning OpenMP threads each cost a fifth more CPU for the same steps.
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'trainers'}", "RAY_AUTH_MODE": "disabled",
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def proof(bundle: Path, tmp_path: Path, *flags: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PROOF), "--bundle", str(bundle), "--out", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work"), "--device", "cpu", "--quick", *flags],
                          capture_output=True, text=True, env=env(), timeout=timeout)


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
    back the worker processes' start-up."""
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


@pytest.mark.slow
def test_quick_proof_runs_every_part_on_cpu(bundle, tmp_path):
    """Every part once on the CPU: the only run of the GPU script's parts here (slow: each part is a process of
    its own that imports torch and builds its models, as on the GPU: about 85 s of CPU)."""
    import gpu_proof
    from audiopipe.sampler.bucket import BucketBatchSampler
    from audiopipe.sampler.bucket_budget import BucketBudget

    t0 = time.monotonic()
    r = proof(bundle, tmp_path, "--parts", "all", "--without", ABSENT, "--trainers", ",".join(REHEARSED),
              timeout=1500)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["bucket_budget_eres2net.json", "bucket_budget_f5tts.json",
                                                     "gpu_proof.json", "gpu_proof.log"]
    doc = json.loads((out / "gpu_proof.json").read_text())
    parts = doc["parts"]
    assert list(parts) == list(gpu_proof.PARTS)
    assert all(p["status"] == "ok" and 0 < p["seconds"] <= p["cap_s"] for p in parts.values())
    assert sum(p["seconds"] for p in parts.values()) < wall
    assert doc["device"]["device"] == "cpu" and doc["device"]["torch"] and doc["without"] == ABSENT
    log = (out / "gpu_proof.log").read_text()
    assert "torch " + doc["device"]["torch"] in log and f"{len(parts)}/{len(parts)} parts ok" in log
    assert all(f"part {p}: ok in" in log for p in parts)

    tests = {t["test"]: t for t in parts["cuda_tests"]["tests"]}
    assert len(tests) == 9 and not [t for t in tests.values() if t["outcome"] == "failed"]
    for name in ("test_bf16_autocast_step_through_core", "test_fp16_gradscaler_skips_an_overflowing_step_and_backs_off",
                 "test_prefetch_delivers_device_tensors_equal_to_the_cpu_path",
                 "test_core_clock_measures_an_injected_delay_as_data_wait",
                 "test_encodec_batched_on_device_equals_one_at_a_time",
                 "test_f5_and_speaker_steps_never_make_the_host_wait"):
        assert tests[name]["outcome"] == "passed", tests[name]
    assert all(t["message"] for t in tests.values() if t["outcome"] == "skipped")  # every skip says why

    def trained(run: dict) -> None:
        assert run["timed_steps"] == 2 and run["step_ms"] > 0 and run["frames_per_s"] > 0, run
        # The clock times every wait for a batch, so a share of 0 means it timed none.
        assert 0 < run["data_wait_share"] < 1, run

    trainers = parts["trainers"]["trainers"]
    assert list(trainers) == list(REHEARSED)
    profiled = parts["profile"]["trainers"]  # the trainer's own --profile-steps output, read back
    assert list(profiled) == list(REHEARSED)
    for run in profiled.values():
        trained(run)
        assert run["profile"]["steps"] == 2 and run["profile"]["first_step"] == 2 and run["profile"]["top_host_ms"]
    for name, t in trainers.items():
        assert t["status"] == "ok", (name, t)
        for prefetch in ("2", "0"):
            run = t[f"prefetch_{prefetch}"]
            trained(run)
            assert run["argv"][run["argv"].index("--prefetch") + 1] == prefetch
    speakers = parts["speakers"]
    assert set(speakers["eres2net"]) == {"device", "cpu"} and set(speakers["campplus"]) == {"device"}
    for run in (*speakers["eres2net"].values(), speakers["campplus"]["device"]):
        trained(run)

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
            assert row["steps"] == 2 and row["vs_on_device"] > 0, row
            # The share is the mean wait over the mean step: the mean wait cannot pass the longest one.
            assert 0 < row["data_wait_share"] * row["step_ms"] <= row["max_wait_ms"] * (1 + 1e-9), row
        assert set(cores["fewest_cores_within"]) == set(feeds)
    rule = parts["speaker_cores"]["rule_per_item"]
    assert rule["crop_s"] == 1.0 and rule["decoded_s"] > 1.0  # whole files, longer than the crop, decoded per item
    assert parts["speaker_cores"]["on_device_features"]["steps"] == 2

    summary = parts["features"]["summary"]
    for f in ("mel", "fbank", "codec"):
        for method in (f"{f} batch 2", f"{f} equal batch 2"):
            p = summary[method]["parity"]
            assert p["codes_equal"] == 1.0 if f == "codec" else p["max_abs_diff"] <= 1e-5, (method, p)
        assert summary[f"{f} equal batch 2"]["padding_efficiency"] == 1.0

    cal = parts["calibrate"]
    holds = cal["holds"]
    assert holds["no_out_of_memory"] and holds["margin"] == 0.1 and holds["frames_per_s_gain"] > 0
    f5 = BucketBudget.read(out / "bucket_budget_f5tts.json")
    assert len(f5.buckets) == 2 and f5.source["device"].startswith("cpu")
    lengths = np.arange(95, 1853)
    assert all(len(b) <= f5.capacities(lengths[b].max()) for b in BucketBatchSampler(lengths, f5, seed=0))
    cmp = cal["f5tts"]["compare"]
    assert cmp["global_max_frames"] == min(b.max_frames for b in f5.buckets) and cmp["gain"] > 0
    assert BucketBudget.read(out / "bucket_budget_eres2net.json").buckets[0].max_len == 16000

    f5 = parts["shapes"]["f5tts"]
    for key in ("eager", "eager_shapes", "compiled_shapes"):
        assert f5[key]["steps"] == 3 and f5[key]["first_seen_steps"] + f5[key]["repeated_steps"] == 3
    assert f5["eager_shapes"]["shapes_met"] <= 8 and f5["compiled_vs_eager_shapes"] > 0
    gpt = parts["shapes"]["gpt_sovits"]  # eager with --shapes (compiling is left to the GPU: minutes on a CPU)
    assert set(gpt) == {"eager_shapes"} and gpt["eager_shapes"]["timed_steps"] == 2


def test_a_failing_part_does_not_stop_the_others(bundle, tmp_path):
    """Without its audio the features part fails with its reason; the CUDA tests still run (and skip the tests
    that need speech, saying so), and the run exits 1 with both results written."""
    broken = tmp_path / "bundle"
    shutil.copytree(bundle, broken, ignore=shutil.ignore_patterns("wavs"))
    r = proof(broken, tmp_path, "--parts", "features,cuda_tests", "--without", ABSENT)
    assert r.returncode == 1, r.stdout[-3000:]
    doc = json.loads((tmp_path / "out" / "gpu_proof.json").read_text())
    assert list(doc["parts"]) == ["cuda_tests", "features"]  # run in the order of value, not as listed
    assert doc["parts"]["features"]["status"] == "failed"
    assert "no audio files" in doc["parts"]["features"]["error"]
    cuda = doc["parts"]["cuda_tests"]
    assert cuda["status"] == "ok" and cuda["counts"]["failed"] == 0 and cuda["counts"]["passed"] >= 1
    assert any("no real speech" in t["message"] for t in cuda["tests"] if t["outcome"] == "skipped")
    assert "part features: failed" in (tmp_path / "out" / "gpu_proof.log").read_text()


def test_a_device_that_cannot_be_read_is_written_down_and_the_parts_still_run(bundle, tmp_path):
    """The device is read in a child (the parent holds no CUDA context); when that child fails, the run says
    why in the JSON and the log and goes on to the parts, each of which records its own outcome."""
    r = proof(bundle, tmp_path, "--parts", "features", "--without", "torch", timeout=120)
    assert r.returncode == 1, r.stdout[-3000:]
    doc = json.loads((tmp_path / "out" / "gpu_proof.json").read_text())
    assert "No module named 'torch'" in doc["device"]["error"]
    assert doc["parts"]["features"]["status"] == "failed"
    assert "device not read" in (tmp_path / "out" / "gpu_proof.log").read_text()


def test_device_cuda_where_torch_sees_none_is_refused_in_one_line_writing_nothing(bundle, tmp_path):
    """The device is read in a child (the parent never touches CUDA): --device cuda on a machine without one is
    still refused with argparse's one error line, exit 2, and no --out folder."""
    r = proof(bundle, tmp_path, "--parts", "features", "--device", "cuda", timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == "gpu_proof.py: error: --device cuda: torch sees no CUDA device here"
    assert not (tmp_path / "out").exists()


def test_a_part_past_its_cap_is_stopped_with_its_processes(bundle, tmp_path):
    import gpu_proof

    work = tmp_path / "work"
    work.mkdir()
    a = argparse.Namespace(bundle=bundle, out=tmp_path, work=work, device="cpu", without="", quick=True,
                           trainers="f5tts")
    t0 = time.monotonic()
    res = gpu_proof.run_child(a, "trainer", 1.0, extra=["--trainer", "f5tts"])  # no trainer starts in a second
    assert res["status"] == "timeout" and res["exit"] is None and time.monotonic() - t0 < 10
    assert "output_tail" in res
    assert running_in_session(res["pid"]) == []  # the child (a session of its own) and all it started are gone


def running_in_session(sid: int) -> list[int]:
    """The live (not zombie) processes of session `sid`."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and os.getsid(int(d.name)) == sid and \
                    (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(d.name))
        except (ProcessLookupError, FileNotFoundError):  # ended while listed
            pass
    return found


def test_a_timeout_ends_that_group_and_the_ones_it_started_not_its_parents(tmp_path):
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


# ----------------------------------------------------------------------------- the pieces


def _read(path: Path) -> bytes:
    with wave.open(str(path), "rb") as w:
        return w.readframes(w.getnframes())


def test_reslice_keeps_every_sample_once_in_items_of_librispeech_like_length(tmp_path):
    import gpu_bundle
    from audiopipe.corpus.demo import ASTERISK_SOUNDS, usable_asterisk_prompts

    require("asterisk-core-sounds-en-wav", "asterisk-core-sounds-en")
    prompts = [(ASTERISK_SOUNDS / f"{n}.wav", t) for n, t in usable_asterisk_prompts()[:60]]
    count, seconds = gpu_bundle.reslice(tmp_path, "allison", prompts, seed=0)
    items = sorted((tmp_path / "allison").glob("slice_*.wav"))
    assert len(items) == count and 1 < count < len(prompts)
    # The items, in order, are the prompts in the seeded order, joined: every sample once, nothing else.
    order = np.random.default_rng(0).permutation(len(prompts)).tolist()
    assert b"".join(_read(p) for p in items) == b"".join(_read(prompts[i][0]) for i in order)
    assert " ".join((p.with_suffix(".txt")).read_text().strip() for p in items) == " ".join(prompts[i][1] for i in order)
    lengths = [gpu_bundle.wav_seconds(p) for p in items]
    assert abs(sum(lengths) - seconds) < 1e-6
    assert min(lengths[:-1]) >= 1.0 and np.median(lengths) > 2 * np.median([gpu_bundle.wav_seconds(p) for p, _ in prompts])


def test_feature_batches_length_sorted_and_equal_length():
    import bench_gpu_features as bgf

    clips = [np.zeros(n, np.float32) for n in (5, 9, 1, 7, 3)]
    plan = bgf.batches(clips, 2)
    assert plan == [[1, 3], [0, 4], [2]]
    assert bgf.padding_efficiency(clips, plan) == pytest.approx(25 / (18 + 10 + 1))
    rng = np.random.default_rng(0)
    clips = [rng.standard_normal(n).astype(np.float32) for n in (900, 100, 500, 520, 480, 1000, 60)]
    cut, plan = bgf.equal_lengths(clips, 3)
    assert sorted(i for b in plan for i in b) == list(range(len(clips)))
    assert [[len(clips[i]) for i in b] for b in plan] == [[1000, 900, 520], [500, 480, 100], [60]]
    assert [{len(cut[i]) for i in b} for b in plan] == [{520}, {100}, {60}]
    assert all(np.array_equal(cut[i], clips[i][: len(cut[i])]) for i in range(len(clips)))  # cut from the start
    assert bgf.padding_efficiency(cut, plan) == 1.0
    assert bgf.padding_efficiency(clips, plan) == pytest.approx(3560 / (3 * 1000 + 3 * 500 + 60))


def test_batched_mel_and_fbank_equal_one_at_a_time_on_real_speech():
    """Length-sorted batches of real utterances of different lengths: each row's frames equal the utterance's
    alone (naive zero-padded mel batches differ by > 0.1 nat), and the padding efficiency follows from the
    lengths alone."""
    import bench_gpu_features as bgf
    from audiopipe.corpus.demo import ASTERISK_SOUNDS

    require("asterisk-core-sounds-en-wav")
    clips = bgf.load_clips(ASTERISK_SOUNDS, 12.0)
    doc = bgf.run(clips, "cpu", [1, 4], 1, features=("mel", "fbank"))
    seen = set()
    for res in doc["results"]:
        for row in res["rows"]:
            seen.add((row["feature"], row["batch"]))
            rate = bgf.RATES[row["feature"]]
            desc = sorted((len(c) for c in clips[rate]), reverse=True)
            assert len(desc) >= 4 and row["audio_s"] == pytest.approx(sum(desc) / rate)
            assert row["parity"]["shapes_equal"] is True and row["parity"]["max_abs_diff"] <= 1e-5
            groups = [desc[i:i + row["batch"]] for i in range(0, len(desc), row["batch"])]
            assert row["padding_efficiency"] == pytest.approx(sum(desc) / sum(len(g) * g[0] for g in groups))
    assert seen == {("mel", 1), ("mel", 4), ("fbank", 1), ("fbank", 4)}


def test_a_grown_corpus_packs_full_batches_where_a_weight_on_one_folder_does_not(f5_shards, tmp_path):
    """Copies as corpora of their own names are distinct items in one plan; a weight k repeats each item in
    rounds that the sampler packs one by one, so a small corpus gives part-full batches in every round."""
    import torch

    import core
    import gpu_proof
    import train_f5tts as f5
    from audiopipe.reader.arrow_dataset import ShardDataset

    a = argparse.Namespace(work=tmp_path, quick=True)
    shards = Path(f5_shards)  # the session's corpus of many short items (the quick bundle's few long ones pack alike)
    total = int(ShardDataset(str(shards), ["mel"]).lengths("mel").sum())
    budget = int(total * 0.7)  # one copy: a full batch and a part-full one

    def batches(shards: str, weights: str | None) -> list[int]:
        cfg = core.RunConfig(shards=shards, weights=weights, out=str(tmp_path / "run"), batch_frames=budget,
                             max_items=64, prefetch=0, seed=0)
        loader = core._make_loader(cfg, core.Dist(device=torch.device("cpu")), ["mel"], None, {"mel": f5.MEL_HASH},
                                   {}, tmp_path)
        loader.set_epoch(0)
        return [int(b["mel_lengths"].sum()) for b in loader]

    grown = batches(",".join(map(str, gpu_proof.grown(a, shards, 8))), None)
    flags = gpu_proof.repeated(a, shards, 8)  # --shards FOLDER,LINK --weights 4,4
    weighted = batches(flags[1], flags[3])
    assert sum(grown) == sum(weighted) == 8 * total  # the same frames an epoch either way
    assert len(grown) < len(weighted)  # ... in fewer, fuller batches
    assert np.mean(grown) > 1.2 * np.mean(weighted)


def test_3d_speakers_rule_decodes_and_perturbs_the_whole_file_for_every_crop(tmp_path):
    """The speaker_cores part's baseline takes 3D-Speaker's path per item: the whole file decoded and
    speed-perturbed (not only the crop's samples), a 3 s crop (a short file zero-padded), speakerlab's own FBank
    (the side venv's, as the oracle), class speaker + speakers * speed; each item at audiopipe's speed for it."""
    import soundfile as sf

    import gpu_proof
    from speaker_data import SpeakerCrops
    from upstream_oracle import run_upstream

    rng = np.random.default_rng(1)
    lengths = (5 * 16000 + 123, 2 * 16000 - 7)  # one longer than a 3 s crop, one shorter
    files = []
    for i, n in enumerate(lengths):
        files.append(str(tmp_path / f"{i}.wav"))
        sf.write(files[-1], (0.1 * rng.standard_normal(n)).astype(np.float32), 16000, subtype="PCM_16")
    speaker = np.array([0, 1] * 8)  # 16 items: the two files, eight times each (as the grown corpus lists them)
    rule = gpu_proof.SpeakerlabRule(files, speaker, 2, seed=0)
    crops = SpeakerCrops(speaker, seed=0)
    items = [rule[g] for g in range(len(speaker))]
    speeds = [crops({"index": g, "pcm": np.zeros(lengths[g % 2], np.int16)})["speed"] for g in range(len(speaker))]
    assert set(speeds) == {0, 1, 2}  # every path taken: 1.0 (no resampling), 0.9 and 1.1
    for g, (item, k) in enumerate(zip(items, speeds)):
        n = lengths[g % 2]
        assert item["decoded"] == n  # the whole file, for every crop
        assert abs(item["perturbed"] - n / rule.speeds[k]) <= 1  # the whole file perturbed, not the crop
        assert item["label"] == speaker[g] + 2 * k
        assert tuple(item["fbank"].shape) == (298, 80)  # 3 s at 25/10 ms
    # speakerlab's FBank on the crops the rule cut: the unperturbed short file is the file itself, zero-padded.
    short = [g for g, k in enumerate(speeds) if k == 0 and g % 2 == 1]
    assert short
    pcm, _ = sf.read(files[1], dtype="float32")
    np.save(tmp_path / "crops.npy", np.pad(pcm, (0, 48000 - len(pcm)))[None])
    run_upstream("speakerlab_fbank.py", tmp_path / "crops.npy", tmp_path / "fbank.npy")
    want = np.load(tmp_path / "fbank.npy")[0]
    for g in short:
        np.testing.assert_allclose(items[g]["fbank"].numpy(), want, atol=2e-4)
