"""Session fixtures: test corpora built once per test session (see tests/corpora.py for the builders).

Each corpus fixture returns a `BuiltCorpus(root: Path, utterances: list[ExpectedUtt])` (utterances sorted by
id, with ids/speakers/texts as `discover(root)` reports them), except `broken_corpus`, which returns a
`BrokenCorpus(root: Path, expected: {file name: reject reason or None})`. Treat the folders as read-only:
copy them first if a test has to change files.
"""

from __future__ import annotations

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

ASTERISK_FILES = 40


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
