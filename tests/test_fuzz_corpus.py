"""The corpus-layer fuzzing harness in CI (tests/fuzz_corpus.py): a fixed seed and example count per kind of
input, derandomized, about a minute in all. `benchmarks/bench_fuzz.py` runs the same harness for longer, with a
seed of its choice, and reports how many examples it tried.

Every example builds a hostile corpus on disk (audio of every container, cut or with a lying header; sidecars
that are pipes, /dev/zero or latin-1; manifests, Kaldi dirs, Emilia JSONL and tars with values of every JSON
type and members of every kind) and checks the invariant: each input is written with exactly the data it
holds or rejected with a reason, discovered = written + rejected, no hang, no traceback, memory bounded."""

from __future__ import annotations

import pytest

from fuzz_corpus import fuzz

# Examples per kind: about 40 s on a quiet 2-core machine in all (benchmarks/bench_fuzz.py runs more). Audio is
# the widest space (every container x every mutation) and gets the most.
EXAMPLES = {"audio": 600, "sidecars": 200, "manifest": 250, "nemo": 200, "lhotse": 100, "shar": 40, "hf": 100,
            "commonvoice": 150, "kaldi": 200, "emilia_jsonl": 200, "emilia_tar": 250}


@pytest.mark.parametrize("kind", list(EXAMPLES))
def test_hostile_corpora_hold_the_invariant(kind):
    if kind in ("lhotse", "shar"):
        pytest.importorskip("lhotse")
    fuzz(kind, EXAMPLES[kind], derandomize=True)()
