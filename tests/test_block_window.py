"""Block-window reading (audiopipe/sampler/block_window.py, audiopipe/reader/blocks.py, Reading(mode="blocks")):
every kept item once per epoch, equal batches per rank, batches under budget and inside their window, a plan
that is a pure function of (seed, epoch, position) with exact resume (also under another world size), a node
partition that keeps each node on its shards, and the same batches from S3 as from the local folder in a few
large requests."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from audiopipe.reader.blocks import block_rows, cut_blocks
from audiopipe.reader.loader import make_loader
from audiopipe.reader.reading import Reading
from audiopipe.sampler.block_window import BlockWindowSampler
from reader_helpers import ROWS_PER_SHARD, write_shards

pytest_plugins = ["s3server"]


def _corpus(seed: int, n: int, block: int):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 400, n)
    lengths[rng.random(n) < 0.02] = 5000  # too long for the budget alone
    blocks = np.arange(n) // block
    return lengths, blocks, np.arange(int(blocks.max()) + 1) // 3  # per block id, its shard: three blocks a shard


def _epoch(sampler, epoch):
    sampler.set_epoch(epoch)
    return [list(b) for b in sampler]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 400), st.integers(1, 40), st.integers(1, 6), st.integers(1, 4),
       st.sampled_from([1, 2]))
def test_every_item_once_equal_counts_under_budget_inside_the_window(seed, n, block, window, world, nodes):
    if world % nodes:
        world *= nodes
    lengths, blocks, shard = _corpus(seed, n, block)
    ranks = [BlockWindowSampler(lengths, blocks, 1500, block_shard=shard, window=window, seed=seed, rank=r,
                                world_size=world, nodes=nodes) for r in range(world)]
    for epoch in (0, 1):
        per_rank = [_epoch(s, epoch) for s in ranks]
        assert len({len(p) for p in per_rank}) == 1 and all(len(p) == len(s) for p, s in zip(per_rank, ranks))
        seen = [i for p in per_rank for b in p for i in b]
        kept = np.flatnonzero((lengths > 0) & (lengths <= 1500))
        d = ranks[0].diagnostics
        assert sorted(set(seen)) == kept.tolist() and len(seen) == kept.size + d.repeated
        for r, p in enumerate(per_rank):
            plan = ranks[r]._plans(epoch, (), world)[r]
            for j, b in enumerate(p):
                assert len(b) * lengths[b].max() <= 1500
                assert set(blocks[b]) <= set(plan.windows[plan.win[j]].tolist())  # only the resident window's rows
                if nodes > 1 and not plan.repeated:  # a node reads its own shards only (unless it has none)
                    assert set(shard[blocks[b]] % nodes) == {r // (world // nodes)}
        assert d.shards_per_batch <= window + 1e-9 and d.kept + d.dropped_empty + d.dropped_too_long == n


def test_the_plan_is_a_pure_function_and_resumes_exactly_also_under_another_world_size():
    lengths, blocks, shard = _corpus(3, 3000, 30)
    mk = lambda r, w: BlockWindowSampler(lengths, blocks, 4000, block_shard=shard, window=4, seed=7,  # noqa: E731
                                         rank=r, world_size=w)
    a, b = mk(0, 2), mk(0, 2)
    assert _epoch(a, 3) == _epoch(b, 3) and _epoch(a, 3) != _epoch(a, 4)
    # Two ranks train 5 steps of epoch 2, checkpoint; three ranks resume from that state.
    twos = [mk(r, 2) for r in range(2)]
    done = []
    for s in twos:
        s.set_epoch(2)
        it = iter(s)
        done += [i for _ in range(5) for i in next(it)]
    state = twos[0].state_dict(consumed_batches=5)
    assert state == twos[1].state_dict(consumed_batches=5)
    threes = [mk(r, 3) for r in range(3)]
    rest = []
    for s in threes:
        s.load_state_dict(state)
        rest.append([i for b in s for i in b])
    assert len({len(s) for s in threes}) == 1
    kept = np.flatnonzero((lengths > 0) & (lengths <= 4000))
    allseen = done + [i for r in rest for i in r]
    assert sorted(set(allseen)) == kept.tolist() and len(set(done) & set(i for r in rest for i in r)) == 0
    # Same world size: the resumed pass yields exactly the batches the uninterrupted one had left.
    s = mk(1, 2)
    s.load_state_dict(state)
    assert [list(b) for b in s] == _epoch(mk(1, 2), 2)[5:]
    with pytest.raises(ValueError, match="another sampler config"):
        BlockWindowSampler(lengths, blocks, 4000, window=5, seed=7, rank=0, world_size=2).load_state_dict(state)


def test_windows_are_announced_ahead_and_released():
    lengths, blocks, shard = _corpus(1, 2000, 25)
    s = BlockWindowSampler(lengths, blocks, 3000, block_shard=shard, window=3, ahead=1, seed=0)
    events = []
    s.on_hold = lambda tag, ids: events.append(("hold", tag[-1], sorted(ids.tolist())))
    s.on_release = lambda tag: events.append(("release", tag[-1]))
    plan = s._plans(0, (), 1)[0]
    seen_windows = []
    for j, b in enumerate(s):
        w = int(plan.win[j])
        held = {e[1] for e in events if e[0] == "hold"} - {e[1] for e in events if e[0] == "release"}
        assert w in held and (w + 1 in held or w + 1 == len(plan.windows))  # this window and the next
        assert set(blocks[b]) <= set(plan.windows[w].tolist())
        seen_windows.append(w)
    assert seen_windows == sorted(seen_windows)
    assert {e[1] for e in events if e[0] == "hold"} == {e[1] for e in events if e[0] == "release"}  # all released
    assert [e[2] for e in events if e[0] == "hold"] == [sorted(w.tolist()) for w in plan.windows]


def test_diagnostics_compare_with_the_row_sampler():
    lengths, blocks, shard = _corpus(5, 4000, 40)
    s = BlockWindowSampler(lengths, blocks, 6000, block_shard=shard, window=4, seed=0)
    d = s.diagnostics
    row = d.row_mode
    assert d.shards_per_batch < row["shards_per_batch"]  # fewer shards per batch: the cost in randomness
    assert d.shards_per_batch <= 4 and row["padding_efficiency"] > 0 and "blocks and" in d.summary()
    # Known cases: a window of one block that is exactly one batch gives the same batch every epoch ...
    same = BlockWindowSampler(np.full(600, 10), np.arange(600) // 6, 60, window=1, seed=0).diagnostics
    assert same.pair_overlap == 1.0 and same.shards_per_batch == 1.0 and same.blocks_per_batch == 1.0
    # ... and windows of 100 one-item blocks, 10 batches each, pair items anew (~1/10 meet again).
    mixed = BlockWindowSampler(np.full(6000, 10), np.arange(6000), 100, window=100, seed=0).diagnostics
    assert mixed.pair_overlap < 0.2 and mixed.shards_per_batch == 10.0


# ---- through make_loader, local and S3 ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("blocks") / "shards", rows_per_shard=(9, 12, 4, 11, 10, 8),
                        tars=False)


def _batches(loader, epochs=(0, 1)):
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out += [{k: (v.clone() if isinstance(v, torch.Tensor) else list(v)) for k, v in b.items()} for b in loader]
    return out


def _same(a, b):
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert (torch.equal(x[k], y[k]) and x[k].dtype == y[k].dtype) if isinstance(x[k], torch.Tensor) \
                else x[k] == y[k], k


BLOCKS = Reading(mode="blocks", block_bytes=1 << 20, window=2, ahead=1)


def test_block_batches_from_s3_equal_the_local_folder_in_a_few_large_requests(local, s3):
    from s3server import upload

    server, bucket = s3
    url = upload(server, local.root, f"{bucket}/blocks")
    kw = dict(max_frames=2500, rank=0, world_size=1, reading=BLOCKS)
    want = _batches(make_loader(local.root, ["mel", "f0"], **kw))
    loader = make_loader(url, ["mel", "f0"], prefetch=2, **kw)
    assert isinstance(loader.sampler, BlockWindowSampler)
    got = _batches(loader)
    _same(want, got)
    d = loader.dataset.diagnostics()
    blocks = len(loader.dataset.blocks(BLOCKS.block_bytes))
    # Every row came out of a held block: one GET per block and feature (twice: two epochs), none per row.
    assert d["ranges_from_blocks"] == d["ranges_taken"] and d["blocks_fetched"] == 2 * 2 * blocks, d
    assert d["bytes_requested_per_byte_delivered"] < 1.1, d
    assert loader.dataset.fetcher().held_bytes == 0  # every window released at the end of its pass
    seen = sorted(i for b in got[:len(got) // 2] for i in b["index"])
    assert seen == list(range(sum((9, 12, 4, 11, 10, 8))))


def test_blocks_cover_every_row_once_in_shard_order(local):
    from audiopipe.reader.arrow_dataset import ShardDataset

    ds = ShardDataset(local.root, ["mel"])
    t = cut_blocks(ds.index, ds.manifest, ["mel"], ds.channels, 300_000)
    rows = block_rows(ds.manifest, t, np.arange(len(t)))
    assert rows.tolist() == list(range(len(ds))) and (t.of_row[rows] == np.repeat(np.arange(len(t)),
                                                                                   t.end - t.start)).all()
    sizes = [r["arrays"]["mel"].nbytes for r in local.rows]
    assert t.nbytes.sum() == sum(sizes)
    assert all(t.nbytes[b] - sizes[rows[t.of_row == b][-1]] < 300_000 for b in range(len(t)))  # cut near the size


def test_auto_reads_a_large_s3_shard_set_in_blocks_and_says_what_blocks_cannot_do(local, s3):
    from s3server import upload

    server, bucket = s3
    url = upload(server, local.root, f"{bucket}/auto")
    small = Reading(blocks_from_bytes=1 << 40)
    big = Reading(blocks_from_bytes=1)
    assert isinstance(make_loader(url, ["mel"], max_frames=2500, reading=big).sampler, BlockWindowSampler)
    assert not isinstance(make_loader(url, ["mel"], max_frames=2500, reading=small).sampler, BlockWindowSampler)
    assert not isinstance(make_loader(local.root, ["mel"], max_frames=2500, reading=big).sampler,
                          BlockWindowSampler)  # a local folder is read by rows
    assert not isinstance(make_loader(url, ["mel"], max_frames=2500, reading=big, num_workers=1).sampler,
                          BlockWindowSampler)
    with pytest.raises(ValueError, match="use num_workers=0 with prefetch"):
        make_loader(url, ["mel"], max_frames=2500, reading=BLOCKS, num_workers=2)
    with pytest.raises(ValueError, match="mix corpora with reading='rows'"):
        make_loader([url, str(local.root)], ["mel"], max_frames=2500, reading=BLOCKS)
    with pytest.raises(ValueError, match="mode must be one of"):
        Reading(mode="window")
