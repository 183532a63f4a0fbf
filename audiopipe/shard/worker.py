"""What a process that builds shards runs before its work, whichever engine it serves (a Ray worker, a local
worker process, or the command's own process with `--workers 0`): its niceness, its heap, one compute thread,
and a warm-up that loads every module and compiled kernel the first shard would otherwise pay for."""

from __future__ import annotations

import os
from pathlib import Path

from audiopipe.shard.job import Job

# One thread per worker process: parallelism comes from processes, and BLAS/torch/numba threads fighting over
# the same cores only slow every worker down. (Set in a worker's environment before it imports them.)
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
              "OPENBLAS_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def default_niceness() -> int:
    """The driver's own niceness: `nice audiopipe shard ...` then means what it says for the workers too."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def set_niceness(nice: int) -> None:
    """Give this process the niceness asked for (a cluster's raylet started it at its own, 15 by default).

    Raising it is always allowed; lowering it needs CAP_SYS_NICE, and without it the worker keeps the
    cluster's setting (documented in docs/extraction.md) rather than failing the shard."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) != nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass


def prepare_worker(nice: int) -> None:
    """Run before the warm-up and each task (each step is cheap when already done): niceness, a heap that keeps
    freed memory (audiopipe.shard.heap), and one torch thread, since parallelism comes from processes."""
    import torch

    from audiopipe.shard.heap import keep_freed_memory

    set_niceness(nice)
    keep_freed_memory()
    torch.set_num_threads(1)


def warm_worker(job_dict: dict, nice: int) -> None:
    """Import what a shard task needs and run the job's features once on a short noise clip, so that the
    compiled kernels are loaded before the first shard."""
    import tempfile

    import numpy as np

    import audiopipe.decode.members  # noqa: F401  (what RecordingCache imports on its first file)
    from audiopipe.decode.audio import resample_to
    from audiopipe.shard.build import array_columns, compute_features, extractors_for, shard_metadata
    from audiopipe.shard.writer import write_arrow, write_tar

    prepare_worker(nice)
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


def load_table_support() -> None:
    """pyarrow imports pandas the first time a process builds a Table (~0.5 s); the driver builds one for the
    index once the shards exist, so pay for it during start-up, beside the workers', instead of after the
    shards."""
    import pyarrow as pa

    pa.table({"x": pa.array([0])})
