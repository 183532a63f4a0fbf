"""Shard tasks on Ray: the engine of a job on a cluster (`--ray-address`), of a large local job, and of any job
with a codec stage.

No actor takes part in progress or completion: progress is counted from the shards the tasks report, in the
driver, so losing any non-head node loses nothing a retried task cannot rebuild. System failures (a dead worker
or node) are retried by Ray on the surviving nodes; exceptions too, for transient storage errors. A task builds a
group of shards and reports each as it is finished (a Ray generator task, see audiopipe.shard.groups); a retry
skips the shards its failed attempt finished and reports them again, which is counted once. A task that ends
without having reported its whole group is never taken for finished: the ledger sends what it left again
(audiopipe.shard.ledger).

Codec encoding is its own Ray stage: actors that hold the model (on a GPU when the cluster has one) and encode
batches sent by the shard tasks. Resources are planned so that shard tasks can always run beside them.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any

from audiopipe.shard.job import Job
from audiopipe.shard.ledger import Ledger
from audiopipe.shard.plan import WorkUnit
from audiopipe.shard.progress import Progress
from audiopipe.shard.ray_setup import check_progress_possible, join_cluster, start_local
from audiopipe.shard.worker import THREAD_ENV, prepare_worker, warm_worker

# A codec actor on a lost node is restarted elsewhere (its state is only the model, reloaded on start), and
# calls that were in flight are retried on the new one; a shard task that still sees the actor fail is retried.
CODEC_ACTOR_RESTARTS = 4


def local_cpus(workers: int, job: Job) -> int:
    """CPUs of the embedded Ray: one per worker, and one more for the codec stage's actor, which would otherwise
    take a worker's CPU (with one worker: the only one, and no shard task could ever start)."""
    return workers + (1 if job.codec else 0)


def _runtime_env(address: str | None) -> dict[str, Any]:
    env: dict[str, Any] = {"env_vars": dict(THREAD_ENV)}
    if address:  # a cluster's workers run the driver's audiopipe, whatever is installed on their nodes
        env["py_modules"] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # the audiopipe folder
    return env


class RayEngine:
    name = "ray"

    def __init__(self, address: str | None, workers: int, nice: int) -> None:
        self.address, self.workers, self.nice = address, workers, nice
        self.cpus = workers
        self._warmups: list[Any] = []
        self._warmups_sent = 0.0

    def start(self, job: Job) -> float:
        """Start (or join) Ray and send every CPU a warm-up task; returns the seconds Ray took to start. The
        warm-ups run while the driver discovers the corpus, and the shard tasks then land on warm processes."""
        import ray

        t = time.monotonic()
        if self.address:
            join_cluster(self.address, _runtime_env(self.address))
        else:
            start_local(local_cpus(self.workers, job), self.nice, _runtime_env(None))
        started = time.monotonic() - t
        resources = ray.cluster_resources()
        self.cpus = int(resources.get("CPU", 0))
        warm = ray.remote(num_cpus=1, max_retries=0)(warm_worker)
        self._warmups = [warm.remote(job.to_dict(), self.nice) for _ in range(max(1, self.cpus))]
        self._warmups_sent = time.monotonic()
        return started

    def await_warmups(self, timeout: float = 120.0) -> float:
        """Wait for the warm-up tasks (the shard tasks would wait for those workers anyway), so that worker
        start-up is counted as start-up; returns the seconds since they were sent. A failed or lost warm-up is
        ignored: the shard tasks report real problems."""
        import ray

        if not self._warmups:
            return 0.0
        ready, _ = ray.wait(self._warmups, num_returns=len(self._warmups), timeout=timeout)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:
                pass
        self._warmups.clear()
        return time.monotonic() - self._warmups_sent

    def slots(self, job: Job) -> int:
        """How many shard tasks can run at once (the cluster's CPUs less the codec stage's)."""
        return max(1, self.cpus - (1 if job.codec else 0))

    def run(self, job: Job, todo: list[WorkUnit], ledger: Ledger, progress: Progress,
            staging: str | None) -> None:
        """Build `todo`, a group per task, until every unit is reported or failed in `ledger`."""
        import ray

        from audiopipe.shard.groups import group_units

        check_progress_possible(self.cpus, 1 if job.codec else 0, self.address)
        shard_task = _remote_defs()
        codec_actors, codec_spec, codec_batch = self._codec_actors(job) if job.codec else ([], None, 1)
        job_dict = job.to_dict()
        tasks: dict[Any, list[WorkUnit]] = {}

        def send(units: list[WorkUnit]) -> list[Any]:
            gens = []
            for g in group_units(units, self.slots(job)):
                gen = shard_task.remote([u.to_dict() for u in g], job_dict, self.nice, codec_actors, codec_spec,
                                        codec_batch, staging)
                tasks[gen] = g
                gens.append(gen)
            return gens

        pending = send(todo)
        while pending:
            # The driver sleeps inside ray.wait until a shard is reported; the timeout only keeps the bar's
            # clock moving. A task is ready when it has a shard to report, or has ended.
            ready, pending = ray.wait(pending, num_returns=1, timeout=progress.tick)
            for gen in ready:
                group = tasks[gen]
                try:
                    item = ray.get(next(gen))
                except StopIteration:  # the task ended: whatever it left unreported is sent again
                    del tasks[gen]
                    pending += send(ledger.settle(group))
                    continue
                except Exception as e:  # after Ray's retries: report, keep building the other groups
                    del tasks[gen]
                    left = ledger.open_units(group)
                    ledger.settle(group, e)
                    progress.add(sum(u.duration for u in left))
                    continue
                progress.add(ledger.report(item, group).duration)
                pending.append(gen)
            progress.refresh()
        for a in codec_actors:
            ray.kill(a)

    def _codec_actors(self, job: Job):
        """Start the codec stage: one actor per GPU in the cluster (keeping a CPU for the shard tasks), or one
        CPU actor when there is none. Each takes one CPU; the embedded Ray has one for it (local_cpus)."""
        import ray

        from audiopipe.shard.codec_stage import CodecWorker

        res = ray.cluster_resources()
        gpus, cpus = int(res.get("GPU", 0)), int(res.get("CPU", 0))
        settings = asdict(job.codec)
        opts = dict(max_restarts=CODEC_ACTOR_RESTARTS, max_task_retries=CODEC_ACTOR_RESTARTS)
        n_gpu = min(gpus, cpus - 1)
        if n_gpu > 0:
            cls = ray.remote(num_gpus=1, num_cpus=1, **opts)(CodecWorker)
            actors = [cls.remote(settings) for _ in range(n_gpu)]
        else:
            cls = ray.remote(num_cpus=1, **opts)(CodecWorker)
            actors = [cls.remote(settings)]
        spec = ray.get(actors[0].spec.remote())
        # Batching pays on a GPU; on a CPU padding to the longest clip only adds work (benchmarks/bench_codec.py).
        return actors, spec, job.codec.batch_size if n_gpu > 0 else 1


def _remote_defs():
    import ray

    @ray.remote(max_retries=3, retry_exceptions=True)
    def shard_task(group: list[dict], job_dict: dict, nice: int, codec_actors, codec_spec, codec_batch: int,
                   staging: str | None):
        from audiopipe.shard.groups import build_group

        prepare_worker(nice)
        # A worker is the raylet's child but not in the driver's process group: when a local job is killed
        # (kill -9 of its group takes the raylet), or its node's raylet dies, the worker is re-parented, and its
        # group stops (raising, so that Ray retries what it had left on a live worker).
        raylet = os.getppid()
        units, job = [WorkUnit.from_dict(u) for u in group], Job.from_dict(job_dict)
        encode = None
        if codec_actors:
            actor = codec_actors[units[0].index % len(codec_actors)]
            bs = codec_batch

            def by_actor(wavs):
                from audiopipe.shard.codec_stage import in_length_order

                return in_length_order(wavs, bs, actor.encode.remote, ray.get)

            encode = by_actor

        # Each shard's done record, and its span for --timings (the done record on disk stays free of them).
        yield from build_group(units, job, staging, orphaned=lambda: os.getppid() != raylet, encode=encode,
                               codec_spec=codec_spec)

    return shard_task
