"""PadCollator: shapes, masks, lengths, padding ratio, pad_to_multiple, buffer reuse without leaks, workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from audiopipe.collate.pad import PadCollator


def make_items(lengths, channels: int, dtype: str, seed: int = 0, fill: float | None = None) -> list[dict]:
    rng = np.random.default_rng(seed)
    items = []
    for i, t in enumerate(lengths):
        shape = (channels, t) if channels else (t,)
        if fill is not None:
            x = np.full(shape, fill, dtype=dtype)
        else:
            x = (rng.integers(1, 100, size=shape)).astype(dtype)  # never 0, so pad is distinguishable
        x.setflags(write=False)  # zero-copy mmap views are read-only
        items.append({"id": f"u{seed}-{i}", "speaker": "s", "feat": x, "frames": int(t)})
    return items


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=9),
    st.sampled_from([0, 1, 3]),
    st.sampled_from(["float32", "int16", "int64", "float16"]),
    st.integers(1, 8),
    st.integers(0, 1000),
)
def test_pad_shapes_masks_lengths_ratio(lengths, channels, dtype, multiple, seed):
    items = make_items(lengths, channels, dtype, seed)
    batch = PadCollator(["feat"], pad_to_multiple=multiple)(items)
    t_max = batch["feat"].shape[-1]
    assert t_max % multiple == 0 and max(lengths) <= t_max < max(lengths) + multiple
    assert batch["feat"].shape == ((len(items), channels, t_max) if channels else (len(items), t_max))
    assert batch["feat"].dtype == torch.from_numpy(np.empty(0, dtype)).dtype
    assert batch["feat_lengths"].tolist() == list(lengths)
    assert batch["feat_mask"].dtype == torch.bool and batch["feat_mask"].shape == (len(items), t_max)
    for i, (item, t) in enumerate(zip(items, lengths)):
        got = batch["feat"][i].numpy()
        assert np.array_equal(got[..., :t], item["feat"])
        assert (got[..., t:] == 0).all()
        assert batch["feat_mask"][i, :t].all() and not batch["feat_mask"][i, t:].any()
    expect = 1 - sum(lengths) / (len(items) * t_max) if t_max else 0.0
    assert batch["padding_ratio"]["feat"] == pytest.approx(expect)
    assert batch["id"] == [it["id"] for it in items] and batch["frames"] == list(lengths)
    assert batch["speaker"] == ["s"] * len(items)


@pytest.mark.parametrize("second_lengths", [[5, 12, 3, 9], [1, 50, 50, 50], [7]])
def test_reused_buffers_never_leak_an_earlier_batch_into_padding(second_lengths):
    # Lengths close together fill the pad box in one call; one short item among long ones pads per item.
    collate = PadCollator(["feat"], ring_size=1, pad_value=0)
    first = collate(make_items([50, 64, 40, 60], 2, "float32", fill=-7.0))
    ptr = first["feat"].data_ptr()
    second = collate(make_items(second_lengths, 2, "float32", seed=1))
    # Same memory (the point of the ring), yet nothing of the -7.0-filled batch shows through.
    assert second["feat"].data_ptr() == ptr
    for i, t in enumerate(second_lengths):
        assert (second["feat"][i, :, t:] == 0).all()
        assert not (second["feat"][i, :, :t] == -7.0).any()
    assert second["feat_mask"].sum() == sum(second_lengths)


def test_ring_alternates_buffers_so_the_previous_batch_survives():
    collate = PadCollator(["feat"], ring_size=2)
    a = collate(make_items([10, 20], 0, "float32", seed=1))
    a_copy = a["feat"].clone()
    b = collate(make_items([15, 5], 0, "float32", seed=2))
    assert b["feat"].data_ptr() != a["feat"].data_ptr()
    assert torch.equal(a["feat"], a_copy)  # batch k is intact while batch k+1 is produced
    c = collate(make_items([8], 0, "float32", seed=3))
    assert c["feat"].data_ptr() == a["feat"].data_ptr()  # ... and reused by batch k + ring_size


def test_buffer_grows_on_demand_and_pad_value_per_feature():
    collate = PadCollator(["mel", "f0"], ring_size=1, pad_value={"mel": -11.5}, pad_to_multiple=8)
    small = [{"mel": np.ones((3, 4), np.float32), "f0": np.ones(4, np.float32)}]
    collate(small)
    big = [{"mel": np.ones((3, t), np.float32), "f0": np.ones(t, np.float32)} for t in (100, 130)]
    out = collate(big)
    assert out["mel"].shape == (2, 3, 136)
    assert (out["mel"][0, :, 100:] == -11.5).all() and (out["f0"][0, 100:] == 0).all()
    assert (out["mel"][1, :, :130] == 1).all()
    assert collate.stats.batches == 2
    assert collate.stats.padding_ratio("mel") == pytest.approx(1 - (4 + 230) / (8 + 2 * 136))


def test_read_only_inputs_are_copied_once_without_warnings(recwarn):
    items = make_items([3, 5], 4, "float32")
    PadCollator(["feat"])(items)
    assert not [w for w in recwarn if "not writable" in str(w.message)]


def test_bad_input_gives_clear_errors():
    good = make_items([3, 4], 2, "float32")
    with pytest.raises(ValueError, match="empty batch"):
        PadCollator(["feat"])([])
    with pytest.raises(KeyError, match="no feature 'mel'"):
        PadCollator(["mel"])(good)
    with pytest.raises(ValueError, match="non-time axes"):
        PadCollator(["feat"])(good[:1] + make_items([4], 3, "float32"))
    with pytest.raises(ValueError, match="same dtype"):
        PadCollator(["feat"])(good[:1] + make_items([4], 2, "float64"))
    with pytest.raises(ValueError, match="has keys"):
        PadCollator(["feat"])([good[0], {**good[1], "extra": 1}])
    with pytest.raises(ValueError, match="overwrite"):
        PadCollator(["feat"])([{**good[0], "feat_mask": 1}])
    with pytest.raises(ValueError, match="scalar"):
        PadCollator(["frames"])(good)
    with pytest.raises(ValueError, match="scalar"):
        PadCollator(["f0"])([{"f0": np.ones(3, np.float32)}, {"f0": np.float32(1.0)}])
    with pytest.raises(ValueError, match="pad_to_multiple"):
        PadCollator(["feat"], pad_to_multiple=0)
    with pytest.raises(ValueError, match="features"):
        PadCollator("feat")


class _Items(torch.utils.data.Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_workers_write_each_batch_into_its_own_shared_memory():
    items = make_items(list(range(1, 41)), 3, "float32", seed=5)
    loader = DataLoader(_Items(items), batch_size=4, collate_fn=PadCollator(["feat"], ring_size=1),
                        num_workers=2, prefetch_factor=4)
    batches = list(loader)  # all held: a reused buffer would show up as later data in earlier batches
    assert len({b["feat"].data_ptr() for b in batches}) == len(batches)
    for k, batch in enumerate(batches):
        for j in range(4):
            item = items[4 * k + j]
            t = item["feat"].shape[-1]
            assert np.array_equal(batch["feat"][j, :, :t].numpy(), item["feat"])
            assert not batch["feat"][j, :, t:].any()


# ---- the mmap reader's columnar batches (RowBatch) ----------------------------------------------------------


def _row_batch(lengths, channels: int, dtype: str, n_shards: int, seed: int):
    """The same items twice: as a RowBatch over flat per-'shard' buffers, and as a list of item dicts."""
    from audiopipe.collate.rows import RowBatch, Rows

    rng = np.random.default_rng(seed)
    n = len(lengths)
    shard_of = rng.integers(0, n_shards, n)
    width = max(channels, 1)
    arrays, items = [], [None] * n
    for k in range(n_shards):
        positions = np.flatnonzero(shard_of == k)
        if positions.size == 0:
            continue
        # rows of a shard sit back to back in one flat buffer, in shard order, with a gap before each
        order = rng.permutation(positions)
        starts, chunks, at = [], [], 0
        for p in order:
            gap = int(rng.integers(0, 5))
            data = rng.integers(1, 100, size=width * lengths[p]).astype(dtype)
            chunks += [np.full(gap, 99, dtype=dtype), data]
            starts.append(at + gap)
            at += gap + data.size
            arr = data.reshape(channels, -1) if channels else data
            items[p] = {"id": f"u{p}", "text": f"t{p}", "feat": arr}
        flat = np.concatenate(chunks) if chunks else np.empty(0, dtype)
        flat.setflags(write=False)
        arrays.append(Rows(flat, np.array(starts, np.int64), np.asarray(lengths, np.int64)[order],
                           order.astype(np.int64)))
    columns = {"id": [f"u{p}" for p in range(n)], "text": [f"t{p}" for p in range(n)]}
    return RowBatch(n, {"feat": channels}, {"feat": arrays}, columns), items


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=9),
    st.sampled_from([0, 1, 3]),
    st.sampled_from(["float32", "int16", "int64", "float16", "uint8", "float64"]),
    st.integers(1, 8),
    st.integers(1, 4),
    st.integers(0, 1000),
)
def test_row_batches_pad_exactly_like_item_lists(lengths, channels, dtype, multiple, n_shards, seed):
    rows, items = _row_batch(lengths, channels, dtype, n_shards, seed)
    pad = -11.5 if dtype.startswith("float") else 7
    fast = PadCollator(["feat"], pad_to_multiple=multiple, pad_value=pad, ring_size=1)(rows)
    slow = PadCollator(["feat"], pad_to_multiple=multiple, pad_value=pad, ring_size=1)(items)
    for k in ("feat", "feat_lengths", "feat_mask"):
        assert fast[k].dtype == slow[k].dtype and fast[k].shape == slow[k].shape
        assert torch.equal(fast[k], slow[k]), k
    assert fast["padding_ratio"] == pytest.approx(slow["padding_ratio"])
    assert fast["id"] == slow["id"] and fast["text"] == slow["text"]
    # Still a sequence of items for code written for lists of dicts.
    assert len(rows) == len(items)
    for got, want in zip(rows, items):
        assert got["id"] == want["id"] and np.array_equal(got["feat"], want["feat"])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=9),
    st.sampled_from([0, 1, 3, 17]),
    st.sampled_from(["float32", "int16", "int64", "float16", "uint8"]),
    st.integers(1, 8),
    st.integers(1, 4),
    st.integers(0, 1000),
)
def test_time_major_layout_is_the_reference_pad_transposed(lengths, channels, dtype, multiple, n_shards, seed):
    """layout="BTC": [B, T_max, C] batches equal to the [B, C, T_max] reference moved axis for axis, from the
    row path (compiled kernel), the item-list path and a ring slot that held a longer batch before."""
    rows, items = _row_batch(lengths, channels, dtype, n_shards, seed)
    pad = -11.5 if dtype.startswith("float") else 7
    reference = PadCollator(["feat"], pad_to_multiple=multiple, pad_value=pad)(items)
    dirty = PadCollator(["feat"], pad_to_multiple=multiple, pad_value=pad, ring_size=1, layout="BTC")
    dirty(_row_batch([45, 44], channels, dtype, 1, seed + 1)[0])  # leaves data where this batch pads
    want = reference["feat"].movedim(-1, 1) if channels else reference["feat"]
    for batch in (dirty(rows), PadCollator(["feat"], pad_to_multiple=multiple, pad_value=pad, layout="BTC")(items)):
        t_max = reference["feat"].shape[-1]
        assert batch["feat"].shape == ((len(lengths), t_max, channels) if channels else (len(lengths), t_max))
        assert batch["feat"].is_contiguous() and torch.equal(batch["feat"], want)
        assert torch.equal(batch["feat_mask"], reference["feat_mask"])
        assert torch.equal(batch["feat_lengths"], reference["feat_lengths"])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=9), st.sampled_from([1, 3]),
       st.sampled_from(["float32", "int16"]), st.integers(1, 4), st.integers(0, 1000), st.sampled_from([0, 3]))
def test_time_major_numpy_copy_writes_the_same_bytes_as_its_kernel(lengths, channels, dtype, n_shards, seed, extra):
    from audiopipe.collate.kernels import _UINT, _pad_rows_time_major, _pad_rows_time_major_numpy

    rows, _ = _row_batch(lengths, channels, dtype, n_shards, seed)
    t_max, uint = max(lengths) + extra, _UINT[np.dtype(dtype).itemsize]
    outs = []
    for kernel in (_pad_rows_time_major, _pad_rows_time_major_numpy):
        dst = np.full(len(lengths) * channels * t_max, 55, dtype=uint)
        for part in rows.arrays["feat"]:
            assert kernel(part.values.view(uint), part.starts, part.frames, part.positions, channels, t_max,
                          uint(7), dst) == -1
        outs.append(dst)
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("layout", ["BCT", "BTC"])
@pytest.mark.parametrize("compiled", [True, False])
def test_a_row_outside_its_column_or_slot_is_refused_not_copied(layout, compiled, monkeypatch):
    """The copy is a raw memcpy: a row that reaches past its column (a damaged offset) or a position past the batch
    must be a clear error before a byte of it is copied, never a read or write out of bounds."""
    from audiopipe.collate import kernels
    from audiopipe.collate.rows import RowBatch, Rows

    if not compiled:  # the numpy copy used while the kernel loads checks the same
        monkeypatch.setitem(kernels._warm, "started", True)
        monkeypatch.setattr(kernels._warm["ready"], "is_set", lambda: False)
    flat = np.arange(3 * 10, dtype=np.float32)
    flat.setflags(write=False)
    for start in (25, -3):  # past the end of its column, before its start
        part = Rows(flat, np.array([0, start], np.int64), np.array([2, 2], np.int64), np.array([0, 1], np.int64))
        batch = RowBatch(2, {"feat": 3}, {"feat": [part]}, {"id": ["u0", "u1"]})
        with pytest.raises(ValueError, match=r"^row 1 of a batch part does not fit: .*column of 30 values") as e:
            PadCollator(["feat"], layout=layout)(batch)
        assert "\n" not in str(e.value)
    dst = np.full(3 * 4, 5, np.float32)  # one slot of 3 x 4; the row is meant for position 1
    part = Rows(flat, np.array([0], np.int64), np.array([2], np.int64), np.array([1], np.int64))
    with pytest.raises(ValueError, match="batch position 1 of a 1 x 3 x 4 batch"):
        kernels.pad_rows_into(dst, [part], 3, 4, 0.0, layout)
    assert (dst == 5).all()
    with pytest.raises(ValueError, match="layout must be one of BCT, BTC"):
        PadCollator(["feat"], layout="TBC")


def test_row_batches_reuse_the_ring_without_leaking_padding():
    collate = PadCollator(["feat"], ring_size=1)
    collate(_row_batch([40, 38, 39], 3, "float32", 2, seed=1)[0])
    rows, items = _row_batch([5, 12, 3], 3, "float32", 2, seed=2)
    batch = collate(rows)
    for i, item in enumerate(items):
        t = item["feat"].shape[-1]
        assert np.array_equal(batch["feat"][i, :, :t].numpy(), item["feat"])
        assert not batch["feat"][i, :, t:].any()
    assert collate.stats.batches == 2


def test_row_batch_errors_are_clear():
    rows, _ = _row_batch([4, 5], 0, "float32", 1, seed=0)
    with pytest.raises(KeyError, match="no feature 'mel'"):
        PadCollator(["mel"])(rows)
    with pytest.raises(IndexError):
        rows[2]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=9),
    st.sampled_from([0, 1, 3]),
    st.sampled_from(["float32", "int16", "int64", "uint8"]),
    st.integers(1, 4),
    st.integers(0, 1000),
    st.sampled_from([0, 3]),
)
def test_numpy_copy_used_while_the_kernel_loads_writes_the_same_bytes(lengths, channels, dtype, n_shards, seed,
                                                                      extra):
    from audiopipe.collate.kernels import _UINT, _pad_rows, _pad_rows_numpy

    rows, _ = _row_batch(lengths, channels, dtype, n_shards, seed)
    width, t_max = max(channels, 1), max(lengths) + extra
    uint = _UINT[np.dtype(dtype).itemsize]
    pad = uint(7)
    outs = []
    for kernel in (_pad_rows, _pad_rows_numpy):
        dst = np.full(len(lengths) * width * t_max, 55, dtype=uint)
        for part in rows.arrays["feat"]:
            kernel(part.values.view(uint), part.starts, part.frames, part.positions, width, t_max, pad, dst)
        outs.append(dst)
    assert np.array_equal(outs[0], outs[1])


def test_make_loader_first_batch_does_not_wait_for_the_kernel(tmp_path):
    """In a fresh process the first batch is copied (correctly) while the kernel still loads in the background."""
    import subprocess
    import sys
    import textwrap

    from reader_helpers import write_shards

    w = write_shards(tmp_path / "s", (6, 5), seed=3, tars=False)
    script = textwrap.dedent(f"""
        import numpy as np
        from audiopipe.collate import kernels
        from audiopipe.reader.loader import make_loader
        from audiopipe.reader.arrow_dataset import ShardDataset
        loader = make_loader({str(w.root)!r}, ["mel"], max_frames=4000, seed=0)
        batch = next(iter(loader))
        ready_at_first = kernels.kernels_ready()
        kernels.wait_for_kernels()
        ds = ShardDataset({str(w.root)!r}, ["mel"])
        for row, i in enumerate(batch["index"]):
            mel = ds[i]["mel"]
            assert np.array_equal(batch["mel"][row, :, :mel.shape[1]].numpy(), mel)
            assert not batch["mel"][row, :, mel.shape[1]:].any()
        print("READY_AT_FIRST", ready_at_first, "READY_AFTER", kernels.kernels_ready())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "READY_AT_FIRST False READY_AFTER True" in out.stdout


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=9),
    st.sampled_from([0, 1, 3]),
    st.sampled_from(["float32", "int16"]),
    st.sampled_from(["BCT", "BTC"]),
    st.integers(1, 4),
    st.integers(0, 1000),
)
def test_shapes_pad_time_to_the_edge_and_items_to_its_size(lengths, channels, dtype, layout, n_shards, seed):
    """With BatchShapes the batch is [size, ..., edge] of the first edge >= its longest item: the items as the
    plain collator gives them, then padding; the empty rows have length 0 and an all-False mask; list keys hold
    the items only. The row-batch path gives the same tensors."""
    from audiopipe.sampler.shapes import BatchShapes

    shapes = BatchShapes((12, 30, 40), (9, 9, 9))
    rows, items = _row_batch(lengths, channels, dtype, n_shards, seed)
    plain = PadCollator(["feat"], pad_value=5, ring_size=1, layout=layout)(items)
    shaped = [PadCollator(["feat"], pad_value=5, ring_size=1, layout=layout, shapes=shapes)(x) for x in (items, rows)]
    n, longest = len(lengths), max(lengths)
    edge = next(e for e in shapes.edges if e >= longest)
    for out in shaped:
        t_axis = 1 if layout == "BTC" else -1
        assert out["feat"].shape[0] == 9 and out["feat"].shape[t_axis] == edge
        assert out["feat_mask"].shape == (9, edge)
        got = out["feat"][:n].narrow(t_axis, 0, plain["feat"].shape[t_axis])
        assert torch.equal(got, plain["feat"])
        assert (out["feat"][n:] == 5).all() and (out["feat"].narrow(t_axis, longest, edge - longest) == 5).all()
        assert out["feat_lengths"].tolist() == list(lengths) + [0] * (9 - n)
        assert not out["feat_mask"][n:].any() and torch.equal(out["feat_mask"][:n, :longest], plain["feat_mask"])
        assert out["id"] == plain["id"]
    assert torch.equal(shaped[0]["feat"], shaped[1]["feat"])


def test_shapes_give_every_feature_the_first_features_rows():
    """Two features of different lengths (GPT-SoVITS's tokens and phones): the first feature picks the shape, and
    the second gets the same rows (padding rows of length 0) with its own T_max, so every tensor has B rows."""
    from audiopipe.sampler.shapes import BatchShapes

    shapes = BatchShapes((12, 30), (6, 4))
    items = [{"tok": np.arange(n, dtype=np.int16), "ph": np.arange(m, dtype=np.int16), "id": f"u{i}"}
             for i, (n, m) in enumerate([(10, 40), (7, 3), (11, 5)])]
    out = PadCollator(["tok", "ph"], shapes=shapes, ring_size=1)(items)
    assert out["tok"].shape == (6, 12) and out["ph"].shape == (6, 40)
    assert out["ph_lengths"].tolist() == [40, 3, 5, 0, 0, 0] and not out["ph_mask"][3:].any()
    assert torch.equal(out["ph"][1, :3], torch.arange(3, dtype=torch.int16))


def test_make_loader_by_default_fills_the_batches_of_78_utterances_at_f5s_budget(tmp_path):
    """Issue 39's goal: make_loader("./shards", ["mel"], max_frames=38_400) on 78 LibriTTS-like utterances plans
    batches at least 80 % full (one pass: under 20 %), with equal batch counts on 2 ranks that together train
    every utterance in every pass and no utterance twice in a batch."""
    from reader_helpers import write_shards

    from audiopipe.bench.synthetic_lengths import synthetic_lengths
    from audiopipe.reader.loader import make_loader

    w = write_shards(tmp_path / "s", (40, 38), seed=1, mel_frames=(20, 30), tars=False)
    lengths = synthetic_lengths("libritts_like", 78, seed=0)  # what the budget counts (the rows are short)
    kw = dict(max_frames=38_400, lengths=lengths, prefetch=0)
    one = make_loader(w.root, ["mel"], passes=1, rank=0, world_size=1, **kw).sampler.diagnostics
    ranks = [make_loader(w.root, ["mel"], rank=r, world_size=2, **kw) for r in (0, 1)]
    d = ranks[0].sampler.diagnostics
    assert one.passes == 1 and one.fill_ratio < 0.20
    assert d.passes > 1 and d.fill_ratio >= 0.80, d.summary()
    per_rank = [list(loader.sampler) for loader in ranks]
    assert len(per_rank[0]) == len(per_rank[1]) == d.batches_per_rank
    seen = np.zeros(78, dtype=np.int64)
    for b in per_rank[0] + per_rank[1]:
        assert len(set(b)) == len(b) and len(b) * int(lengths[b].max()) <= 38_400
        seen[b] += 1
    assert seen.min() >= d.passes and seen.max() <= d.passes + 1  # every pass, a few once more (the top-up)


def test_make_loader_fills_a_small_corpus_and_pads_to_the_samplers_shapes(tmp_path):
    """make_loader's default (passes=None) plans a corpus of 2 budgets as several passes (fuller batches than
    passes=1), and shapes=2 hands over batches of the sampler's two shapes only, the items first and exact."""
    from reader_helpers import write_shards

    from audiopipe.reader.arrow_dataset import ShardDataset
    from audiopipe.reader.loader import make_loader

    w = write_shards(tmp_path / "s", (6, 5), seed=3, tars=False)
    one = make_loader(w.root, ["mel"], max_frames=10**9, passes=1, prefetch=0)
    lengths = one.sampler.lengths
    budget = max(int(lengths.sum()) // 2, int(lengths.max()))
    one = make_loader(w.root, ["mel"], max_frames=budget, prefetch=0, passes=1)
    auto = make_loader(w.root, ["mel"], max_frames=budget, prefetch=0)
    assert one.sampler.passes == 1 and auto.sampler.passes > 1
    assert auto.sampler.diagnostics.fill_ratio > one.sampler.diagnostics.fill_ratio
    shaped = make_loader(w.root, ["mel"], max_frames=budget, shapes=2, prefetch=0)
    allowed = set(zip(shaped.sampler.shapes.sizes, shaped.sampler.shapes.edges))
    ds = ShardDataset(w.root, ["mel"])
    seen = set()
    for batch in shaped:
        rows, t = batch["mel"].shape[0], batch["mel"].shape[-1]
        assert (rows, t) in allowed and rows * t <= budget
        seen.add((rows, t))
        n = len(batch["index"])
        for row, i in enumerate(batch["index"]):
            mel = ds[i]["mel"]
            assert np.array_equal(batch["mel"][row, :, :mel.shape[1]].numpy(), mel)
        assert batch["mel_lengths"][n:].eq(0).all() and not batch["mel_mask"][n:].any()
    assert seen
