"""WebDataset streaming: same samples as the mmap reader, the same budget rules, equal counts on every rank."""

from __future__ import annotations

import json
import textwrap
import warnings

import numpy as np
import pytest

from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.errors import ConfigMismatch, ShardError
from audiopipe.reader.wds import WdsStream, make_wds_loader, round_robin_taken, water_fill
from audiopipe.sampler.plan import BatchBudget
from reader_helpers import as_sha256_shards, copy_shards, run_torchrun, set_manifest_entry, write_shards

ROWS = (6, 9, 3, 7, 8)  # 5 tars, 33 utterances


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("wds") / "shards", ROWS, seed=1)


def _mel_lengths(w) -> np.ndarray:
    return np.array([r["arrays"]["mel"].shape[1] for r in w.rows])


def _epoch(loader, epoch: int = 0) -> list[list[int]]:
    loader.set_epoch(epoch)
    return [batch["index"] for batch in loader]


class _Keep:
    """item_transform that records the sample dicts it sees (main process only)."""

    def __init__(self):
        self.items = []

    def __call__(self, item):
        self.items.append(item)
        return item


def test_samples_are_the_dicts_shard_dataset_gives(shards):
    keep = _Keep()
    feats = ["mel", "f0", "voiced", "pcm"]
    loader = make_wds_loader(shards.root, feats, max_frames=2000, length_feature="mel", item_transform=keep)
    batches = _epoch(loader)
    ref = ShardDataset(shards.root, feats)
    assert sorted(i for b in batches for i in b) == list(range(len(shards.rows)))
    assert len(keep.items) == len(shards.rows)
    for item in keep.items:
        want = ref[item["index"]]
        assert set(item) == set(want)
        for k, v in want.items():
            if isinstance(v, np.ndarray):
                assert item[k].dtype == v.dtype and item[k].shape == v.shape, k
                np.testing.assert_array_equal(item[k], v)
            else:
                assert item[k] == v, k
    np.testing.assert_array_equal(keep.items[0]["pcm"], shards.rows[keep.items[0]["index"]]["arrays"]["pcm"])  # flac


@pytest.mark.parametrize("quadratic,max_items", [(0.0, None), (1 / 300, 4)])
def test_batches_keep_the_budget_and_cover_every_kept_sample(shards, quadratic, max_items):
    budget = BatchBudget(1800, quadratic, max_items)
    lengths = _mel_lengths(shards)
    stream = WdsStream(shards.root, ["mel"], max_frames=1800, quadratic=quadratic, max_items=max_items,
                       pool_size=12)
    loader = make_wds_loader(shards.root, ["mel"], max_frames=1800, quadratic=quadratic, max_items=max_items,
                             pool_size=12)
    plan = loader.plan()
    seen = []
    for batch in loader:
        ids = batch["index"]
        seen += ids
        b, t_max = len(ids), batch["mel"].shape[-1]
        assert t_max == lengths[ids].max()
        assert budget.cost(b, t_max) <= 1800 and (max_items is None or b <= max_items)
        for row, i in enumerate(ids):
            np.testing.assert_array_equal(batch["mel"][row, :, : lengths[i]].numpy(), shards.rows[i]["arrays"]["mel"])
    too_long = np.flatnonzero(~budget.fits_alone(lengths))
    assert plan.dropped_too_long == too_long.size
    assert sorted(seen) == sorted(set(range(len(lengths))) - set(too_long.tolist()))
    assert plan.kept == len(seen) and plan.dropped_uneven == 0
    assert stream.plan().batches_per_rank == len(loader) == plan.batches_per_rank  # planned without reading


def test_plans_are_deterministic_and_change_with_the_epoch(shards):
    a = make_wds_loader(shards.root, ["mel"], max_frames=1500, seed=4)
    b = make_wds_loader(shards.root, ["mel"], max_frames=1500, seed=4)
    assert _epoch(a, 0) == _epoch(b, 0)
    assert _epoch(a, 1) != _epoch(a, 0)
    assert _epoch(make_wds_loader(shards.root, ["mel"], max_frames=1500, seed=5), 0) != _epoch(a, 0)


@pytest.mark.parametrize("world,workers", [(2, 2), (3, 2)])
def test_every_rank_yields_the_same_count_and_drops_are_counted(shards, world, workers):
    """2 x 2 streams read their own tars; 3 x 2 > 5 tars falls back to every stream reading every tar."""
    per_rank, plans = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rank in range(world):
            loader = make_wds_loader(shards.root, ["mel"], max_frames=1200, num_workers=workers, rank=rank,
                                     world_size=world, pool_size=8, seed=2)
            loader.set_epoch(1)
            plans.append(loader.plan())
            per_rank.append(_epoch(loader, 1))
            assert len(per_rank[-1]) == len(loader)
    plan = plans[0]
    assert plan.split == ("tar" if world * workers <= len(ROWS) else "sample")
    assert any("every stream reads every tar" in str(w.message) for w in caught) == (plan.split == "sample")
    assert {len(b) for b in per_rank} == {plan.batches_per_rank}  # equal counts: no rank waits forever
    ids = [i for batches in per_rank for b in batches for i in b]
    assert len(ids) == len(set(ids))  # nothing twice
    assert len(ids) + plan.dropped_uneven == plan.kept == len(shards.rows)  # nothing lost silently
    assert plan.dropped_batches == int(plan.counts.sum() - plan.quotas.sum())
    assert all(p.summary() == plan.summary() for p in plans)  # every rank plans the same epoch alone
    assert "batches/rank" in plan.summary()


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_yields_exactly_the_rest(shards, workers):
    kw = dict(max_frames=1000, num_workers=workers, pool_size=10, seed=7)
    full = _epoch(make_wds_loader(shards.root, ["mel"], **kw), 3)
    assert len(full) >= 6
    first = make_wds_loader(shards.root, ["mel"], **kw)
    first.set_epoch(3)
    it = iter(first)
    taken = [next(it)["index"] for _ in range(5)]
    state = json.loads(json.dumps(first.state_dict(consumed_batches=5)))
    del it
    assert taken == full[:5]
    again = make_wds_loader(shards.root, ["mel"], **kw)
    again.load_state_dict(state)
    again.set_epoch(3)  # the usual loop calls it: the same epoch keeps the resume
    assert len(again) == len(full) - 5
    it = iter(again)
    assert [next(it)["index"] for _ in range(2)] == full[5:7]
    state2 = again.state_dict(consumed_batches=2)  # counted from the resumed position
    assert state2["consumed"] == 7
    assert [b["index"] for b in it] == full[7:]
    third = make_wds_loader(shards.root, ["mel"], **kw)
    third.load_state_dict(state2)
    assert [b["index"] for b in third] == full[7:]
    assert _epoch(again, 4) == _epoch(make_wds_loader(shards.root, ["mel"], **kw), 4)  # next epoch is whole
    other = make_wds_loader(shards.root, ["mel"], **{**kw, "num_workers": 1 - min(workers, 1)})
    with pytest.raises(ValueError, match="cannot be re-dealt"):
        other.load_state_dict(state)


def test_subset_and_budget_lengths(shards):
    """Training speakers only, and a budget counted on other lengths (e.g. crops), as make_loader allows."""
    subset = np.array([i for i, r in enumerate(shards.rows) if r["speaker"] == "spk1"])
    crops = np.full(subset.size, 100)
    loader = make_wds_loader(shards.root, ["mel"], max_frames=450, subset=subset, lengths=crops)
    batches = _epoch(loader)
    assert sorted(i for b in batches for i in b) == subset.tolist()
    assert all(len(b) <= 4 for b in batches) and max(len(b) for b in batches) == 4  # 4 x 100 <= 450
    plan = loader.plan()
    assert plan.dropped_unused == len(shards.rows) - subset.size and plan.kept == subset.size
    with pytest.raises(ValueError, match="lengths has 3 entries, expected"):
        make_wds_loader(shards.root, ["mel"], max_frames=450, subset=subset, lengths=[1, 2, 3])
    with pytest.raises(ValueError, match="tar_url"):
        make_wds_loader(shards.root, ["mel"], max_frames=450, tar_url="pipe:cat {bucket}/{path}")


@pytest.mark.parametrize("quotas,consumed", [([3, 3], 4), ([5, 2, 4], 9), ([0, 2], 2), ([4, 1], 5)])
def test_round_robin_matches_dataloader_order(quotas, consumed):
    # A DataLoader asks workers 0, 1, ... in turn and skips exhausted ones.
    left, taken, w = list(quotas), [0] * len(quotas), 0
    for _ in range(consumed):
        while left[w % len(quotas)] == 0:
            w += 1
        left[w % len(quotas)] -= 1
        taken[w % len(quotas)] += 1
        w += 1
    assert round_robin_taken(np.array(quotas), consumed).tolist() == taken


def test_water_fill_cuts_the_largest_first():
    assert water_fill(np.array([5, 2, 7]), 10).tolist() == [4, 2, 4]
    assert water_fill(np.array([3, 3]), 6).tolist() == [3, 3]
    q = water_fill(np.array([9, 1, 4, 4]), 11)
    assert q.sum() == 11 and (q <= [9, 1, 4, 4]).all() and q.max() - q[q < [9, 1, 4, 4]].min(initial=q.max()) <= 1


# ---- refusals: errors name the tar, never garbage ------------------------------------------------------------


def test_config_hash_mismatch_is_refused(shards):
    with pytest.raises(ConfigMismatch, match="asks for deadbeef"):
        make_wds_loader(shards.root, ["mel"], max_frames=1500, expect={"mel": "deadbeef"})


def test_shards_without_tars_are_refused(tmp_path):
    w = write_shards(tmp_path / "s", (2, 2), tars=False)
    with pytest.raises(ShardError, match="no WebDataset tars.*--no-tar"):
        make_wds_loader(w.root, ["mel"], max_frames=1500)


def test_truncated_tar_is_named(shards, tmp_path):
    w = copy_shards(shards, tmp_path / "s")
    p = w.shard_path(1, "tar")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match=r"tar shard-000001 .* bytes, manifest says"):
        _epoch(make_wds_loader(w.root, ["mel"], max_frames=1500))
    set_manifest_entry(w.root, 1, "tar")  # sizes agree: the stream itself must notice the missing samples
    with pytest.raises(ShardError, match=r"tar shard-000001 .*(ends after|unreadable)"):
        _epoch(make_wds_loader(w.root, ["mel"], max_frames=1500))


def _member_offset(tar_path, suffix: str) -> int:
    import tarfile

    with tarfile.open(tar_path) as t:
        m = next(m for m in t.getmembers() if m.name.endswith(suffix))
        return m.offset_data


def test_corrupted_npy_header_is_named(shards, tmp_path):
    w = copy_shards(shards, tmp_path / "s")
    p = w.shard_path(2, "tar")
    data = bytearray(p.read_bytes())
    data[_member_offset(p, ".mel.npy") + 1] ^= 0xFF  # the npy magic: same size, undecodable
    p.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=r"tar shard-000002 .*sample 'spk0/utt02%2E000'.*mel is undecodable"):
        _epoch(make_wds_loader(w.root, ["mel"], max_frames=1500))


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_checksum_catches_a_flipped_value_locally_and_over_a_pipe(shards, tmp_path, algorithm):
    w = copy_shards(shards, tmp_path / "s")
    if algorithm == "sha256":  # tars made before xxh3: checked by the algorithm their manifest names
        as_sha256_shards(w.root)
    p = w.shard_path(3, "tar")
    data = bytearray(p.read_bytes())
    data[_member_offset(p, ".mel.npy") + 500] ^= 0x40  # a mel value: decodes fine, only a hash sees it
    p.write_bytes(bytes(data))
    _epoch(make_wds_loader(w.root, ["mel"], max_frames=1500))  # sizes alone cannot tell
    with pytest.raises(ShardError, match=f"tar shard-000003 .*fails its {algorithm} checksum"):
        _epoch(make_wds_loader(w.root, ["mel"], max_frames=1500, verify="checksum"))
    url = f"pipe:cat {w.root}/{{path}}"
    with pytest.raises(ShardError, match=f"tar shard-000003 .*fails its {algorithm} checksum"):
        _epoch(make_wds_loader(w.root, ["mel"], max_frames=1500, verify="sha256", tar_url=url))  # old name


def test_pipe_urls_stream_the_same_batches(shards):
    local = _epoch(make_wds_loader(shards.root, ["mel", "pcm"], max_frames=1500))
    url = f"pipe:cat {shards.root}/{{path}}"
    piped = _epoch(make_wds_loader(shards.root, ["mel", "pcm"], max_frames=1500, tar_url=url))
    assert piped == local
    with pytest.raises(ShardError, match="tar shard-0000"):
        _epoch(make_wds_loader(shards.root, ["mel"], max_frames=1500, tar_url="pipe:cat /nonexistent/{name}.tar"))


_DDP_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from audiopipe.reader.wds import make_wds_loader

    dist.init_process_group("gloo")
    loader = make_wds_loader(sys.argv[1], ["mel"], max_frames=1200, pool_size=8, seed=3)
    loader.set_epoch(1)
    out = {"len": len(loader), "batches": [b["index"] for b in loader], "dropped": loader.plan().dropped_uneven}
    with open(f"{sys.argv[2]}/rank{dist.get_rank()}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
""")


def test_torchrun_two_ranks_stream_equal_counts(shards, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(_DDP_SCRIPT)
    run_torchrun(script, str(shards.root), str(tmp_path))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert len(r0["batches"]) == len(r1["batches"]) == r0["len"] == r1["len"] > 0
    ids = [i for b in r0["batches"] + r1["batches"] for i in b]
    assert len(ids) == len(set(ids)) and len(ids) + r0["dropped"] == len(shards.rows)
