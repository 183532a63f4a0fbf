"""The Python snippets of README.md and docs/ run, on a small demo corpus sharded in a fixture.

Every ```python block is found by file and position. It runs as written, after the substitutions listed in
SUBST (the docs' example paths -> the demo's folders, names a snippet leaves to the reader -> small values).
The blocks that cannot run here are in SKIP, each with its reason (left out, not skipped); a new block is run by
default, so a doc cannot gain an untested snippet silently, and a SKIP entry that no longer matches a block fails
the test.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

# (file, index of the python block in that file) -> why it cannot run in a unit test
SKIP = {
    ("docs/ns2-data.md", 0): "needs a forced aligner's TextGrid and a trimmed utterance (names from the prose)",
    ("docs/ns2-data.md", 1): "needs released EnCodec weights (/models/encodec_24khz)",
    ("docs/ns2-data.md", 2): "fetches released EnCodec weights from the Hugging Face hub (network)",
    ("docs/loader.md", 1): "needs a GPU (device='cuda')",
    ("docs/loader.md", 4): "needs S3 (`aws s3 cp` in tar_url)",
    ("docs/export.md", 1): "reads fbank and pcm, which the mel-only demo shards lack (tested in test_export_lhotse)",
    ("docs/trainers/ns2.md", 0): "scores from a model's forward pass (tested in test_mas)",
}

# The docs' example paths and free names -> the demo's. Placeholders: {shards}, {shards2}, {corpus}, {tmp}.
PRELUDE = "ckpt = {}\nepochs = 1\nwant_checkpoint = True\n"
SUBST = {
    # the local cache of s3:// shards needs S3: the mix runs on a second local folder without it
    "README.md": [('"s3://bucket/emilia"', '"{shards2}"'), ('"./libritts"', '"{shards}"'),
                  (',\n                  reading=Reading(cache_dir="/scratch/shards", max_cache_bytes=200 << 30))', ")"), ("range(10)", "range(2)")],
    "docs/corpus.md": [('"/data/LJSpeech-1.1"', '"{corpus}"')],
    "docs/api.md": [('"/data/LJSpeech-1.1"', '"{corpus}"')],
    # the load_from_disk block reads the folder the export_hf block just above it writes (in any test order)
    "docs/export.md": [("import datasets\n", "import datasets, os\nfrom audiopipe.export.hf import export_hf\n"
                        "os.path.isdir('./hf_dataset') or export_hf('./shards', './hf_dataset')\n")],
    # the budget file the doc shows just above the block, and lengths to plan (the doc's prose names them)
    "docs/sampler.md": [('budget = BucketBudget.read("f5_budget.json")',
                         'import json, numpy as np\n'
                         'from audiopipe.sampler.bucket import BucketBatchSampler\n'
                         'from audiopipe.reader.loader import make_loader\n'
                         'lengths = np.arange(100, 1000)\n'
                         'open("f5_budget.json", "w").write(json.dumps(dict(format="audiopipe.bucket_budget/1", '
                         'buckets=[dict(max_len=400, max_frames=150000, max_items=600), '
                         'dict(max_len=1200, max_frames=160000, max_items=200)])))\n'
                         'budget = BucketBudget.read("f5_budget.json")')],
    # nccl and .cuda() need a GPU: the same loop on gloo and the CPU
    "docs/loader.md": [('"nccl"', '"gloo"'), (".cuda(non_blocking=True)", ".to('cpu', non_blocking=True)"), ('"/data/libritts"', '"{shards}"'), ('"/data/emilia"', '"{shards2}"')],
}


def _blocks():
    for path in DOCS:
        rel = str(path.relative_to(ROOT))
        for i, m in enumerate(FENCE.finditer(path.read_text(encoding="utf-8"))):
            yield rel, i, m.group(1)


BLOCKS = list(_blocks())


def test_skip_list_names_real_blocks():
    present = {(rel, i) for rel, i, _ in BLOCKS}
    stale = sorted(set(SKIP) - present)
    assert not stale, f"SKIP names python blocks that no longer exist: {stale}"


@pytest.fixture(scope="module")
def demo(espeak_corpus, f5_shards, tmp_path_factory):
    """cwd with ./shards (the f5tts mel shards of the espeak corpus) and a second copy for the mixing snippets."""
    tmp = tmp_path_factory.mktemp("docs_demo")
    shutil.copytree(f5_shards, tmp / "shards")
    shutil.copytree(f5_shards, tmp / "shards2")
    return {"shards": str(tmp / "shards"), "shards2": str(tmp / "shards2"), "corpus": str(espeak_corpus.root),
            "tmp": str(tmp)}


# The blocks of SKIP are left out here rather than skipped: each is a decision with its reason above, and a run's
# only skips are the ones tests/skips.py allows.
RUN = [b for b in BLOCKS if b[:2] not in SKIP]


@pytest.mark.parametrize("rel,i,code", RUN, ids=[f"{rel}:{i}" for rel, i, _ in RUN])
def test_snippet_runs(rel, i, code, demo, monkeypatch, tmp_path):
    for old, new in SUBST.get(rel, []):
        code = code.replace(old, new.format(**demo))
    monkeypatch.chdir(demo["tmp"])
    import torch.distributed as dist

    if "init_process_group" in code:  # one process group of one rank, on a free port
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
            monkeypatch.setenv(k, v)
    try:
        exec(compile(PRELUDE + code, f"{rel}[python block {i}]", "exec"), {"__name__": "__docs__"})
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
