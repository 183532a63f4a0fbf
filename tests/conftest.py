"""Session fixtures: test corpora built once per test session (see tests/corpora.py for the builders).

Each corpus fixture returns a `BuiltCorpus(root: Path, utterances: list[ExpectedUtt])` (utterances sorted by
id, with ids/speakers/texts as `discover(root)` reports them), except `broken_corpus`, which returns a
`BrokenCorpus(root: Path, expected: {file name: reject reason or None})`. Treat the folders as read-only:
copy them first if a test has to change files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # make `import corpora` work from any test module

from corpora import (  # noqa: E402
    BrokenCorpus,
    BuiltCorpus,
    make_asterisk_corpus,
    make_broken_files,
    make_espeak_corpus,
    make_synthetic_corpus,
)
from skips import (  # noqa: E402,F401  the skip count and reasons at the end; `make test` fails on any not allowed
    pytest_collectreport,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

ASTERISK_FILES = 40

# torch.compile's inductor compiles in a pool of one subprocess per core by default, each importing torch again
# (seconds of CPU) to compile the one or two kernels of the tests' small models: compiling them in the process
# that asks is a quarter cheaper (test_compile_at_fixed_shapes_trains_the_eager_losses: 27 s of CPU against 36 s
# on 2 cores). Set here, it reaches the subprocesses too (the GPU proof's compiled shapes).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


# The modules that take longest, longest first (gpu_proof some 150 s of one worker; the rest of the list from
# about 100 s down to 15 s, e.g. the NS2 trainer 61 s of CPU alone). `make test` hands whole files to two workers
# (--dist loadfile), and a worker gets its next file once at most 2 of its tests are left: started first, the long
# modules overlap each other and the many short ones fill the gaps at the end. A long module left out of this list
# runs in alphabetical order among the short ones, and one that comes late keeps its worker busy after the other is
# done. The two librosa-oracle modules (their numba kernels compile once per run: librosa_kernels) sit far apart,
# so that the second worker to need librosa finds its cache rather than waits for the compile.
SLOWEST_FIRST = [
    "test_gpu_proof.py", "test_train_ns2.py", "test_shard_s3.py", "test_checkpoint_f5tts.py",
    "test_train_gpt_sovits.py", "test_trainer_core.py", "test_shard_cluster.py", "test_mandarin_e2e.py",
    "test_faults.py", "test_shard_engines.py", "test_checkpoint_speaker.py", "test_shard_security.py",
    "test_reader_s3.py", "test_train_nonfinite.py", "test_mix.py", "test_train_f5tts.py", "test_features_mel.py",
    "test_train_speaker.py", "test_shard.py", "test_bench_loader.py", "test_bench_extract.py",
    "test_corrupt_shards.py", "test_wds_stream.py", "test_checkpoint_gpt_sovits.py", "test_step_parity_f5tts.py",
    "test_step_parity_gpt_sovits.py", "test_step_parity_speaker.py", "test_features_misc.py",
]


def pytest_configure(config):
    # xdist's default reorders files by test count, which would undo SLOWEST_FIRST (see pytest_collection_...).
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False
    # Under pytest-xdist each worker is one of N test processes sharing the machine's cores: torch's default of a
    # thread per core would have N times the cores in spinning OpenMP threads whenever two workers compute at once
    # (on 2 cores, many times slower than one thread each). Each worker takes its share of the cores instead;
    # subprocesses (torchrun ranks, Ray workers, the CLI) set their own.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        # Many tests run a trainer's main or core.train in this process: its setup_dist takes a thread per core
        # unless OMP_NUM_THREADS is set, and the worker then kept that for the rest of its tests (2 threads in each
        # of the 2 workers on 2 cores). Set, it keeps the worker's share; subprocesses that set nothing get it too.
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def pytest_collection_modifyitems(session, config, items):
    """The slowest modules first, the rest in their usual order (a stable sort: each file's tests stay together
    and in order)."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="module", autouse=True)
def no_ray_left_running():
    """A module that started Ray in this process (`engine="ray"`) shuts it down when it ends: left running, an
    idle embedded Ray (its servers and prestarted workers) spends ~0.05 CPU-s a second, which over the rest of a
    10-minute run takes ~25 CPU-s from the other tests on 2 cores. A later module that needs Ray starts its own."""
    yield
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`): on a shared
    2-core machine two spinning OpenMP threads can be many times slower than one."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def librosa_kernels(tmp_path_factory: pytest.TempPathFactory) -> None:
    """librosa's numba kernels compiled once per run, not once per test process (`pytestmark =
    pytest.mark.usefixtures("librosa_kernels")` in a module that uses librosa as its oracle). `make venv`
    compiles them already; on a venv built otherwise, importing librosa.util compiles them (~16 s of CPU) and
    caches them beside librosa's source: under the lock, which every xdist worker of the run shares, the first
    worker compiles and the others load its cache (~1 s) instead of compiling the same kernels at the same time."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # under xdist: the run's folder above each worker's own
    with FileLock(str(shared / "librosa-numba.lock")):
        import librosa.util.utils  # noqa: F401  the import compiles or loads the kernels


@pytest.fixture(scope="session")
def synthetic_corpus(tmp_path_factory: pytest.TempPathFactory) -> BuiltCorpus:
    """9 harmonic tones (3 speakers x 3 F0s, 16/22.05/24 kHz, LJSpeech folders) + 3 chirps (sidecar .txt)."""
    root = tmp_path_factory.mktemp("synthetic")
    return BuiltCorpus(root, make_synthetic_corpus(root))


@pytest.fixture(scope="session")
def broken_corpus(tmp_path_factory: pytest.TempPathFactory) -> BrokenCorpus:
    """Empty, truncated, non-audio, NaN/inf, silent, too short/long, bad-rate, 6-channel and valid files."""
    root = tmp_path_factory.mktemp("broken")
    return BrokenCorpus(root, make_broken_files(root))


@pytest.fixture(scope="session")
def asterisk_corpus(tmp_path_factory: pytest.TempPathFactory) -> BuiltCorpus:
    """40 real 8 kHz prompts by one speaker, LJSpeech layout (metadata.csv + wavs/ symlinks); speaker ""."""
    root = tmp_path_factory.mktemp("asterisk")
    return BuiltCorpus(root, make_asterisk_corpus(root, n=ASTERISK_FILES))


@pytest.fixture(scope="session")
def espeak_corpus(tmp_path_factory: pytest.TempPathFactory) -> BuiltCorpus:
    """4 espeak-ng speakers x 6 sentences at 22.05 kHz, <speaker>/<utt>.wav + .txt; skipped without espeak-ng."""
    root = tmp_path_factory.mktemp("espeak")
    return BuiltCorpus(root, make_espeak_corpus(root, speakers=4, per_speaker=6))


@pytest.fixture(scope="session")
def speech_pool(tmp_path_factory: pytest.TempPathFactory):
    """Real speech at 24 kHz for the English layout and manifest corpora (tests/corpora_en.py): [voice][clip]."""
    from corpora_en import speech_pool as build

    return build(str(tmp_path_factory.mktemp("speech_pool")))


@pytest.fixture(scope="session")
def f5_shards(espeak_corpus: BuiltCorpus, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The espeak corpus sharded with the f5tts preset's vocos mel (read-only: the F5 trainer and checkpoint tests
    share it)."""
    from shard_helpers import shard

    out = tmp_path_factory.mktemp("f5_shards")
    shard(espeak_corpus.root, out, [("vocos_mel", {})])
    return out
