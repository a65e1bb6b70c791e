"""PackedIterableDataset over ranks x DataLoader workers: each epoch yields every row exactly
once (plus the stated, counted remainder), in a new order per epoch, reproducible from
(seed, epoch), each rank reading whole row groups."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packtool.loader import PackedIterableDataset, collate  # noqa: E402

from loader_helpers import many_groups  # noqa: E402,F401


def epoch_rows(out, world_size, num_workers, *, epoch=0, seed=0, **kw):
    """Global row indices each rank yields in one epoch through a DataLoader."""
    per_rank = []
    for rank in range(world_size):
        ds = PackedIterableDataset(out, rank=rank, world_size=world_size, seed=seed, **kw)
        ds.set_epoch(epoch)
        dl = torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=collate,
                                         num_workers=num_workers)
        per_rank.append([i for b in dl for i in b["index"]])
    return per_rank


@pytest.mark.parametrize("world_size,num_workers", [(1, 0), (2, 2), (3, 1), (8, 2)])
def test_every_row_exactly_once_per_epoch_padding_counted(many_groups, world_size, num_workers):
    """Default policy (drop_last=False): all rows once, then `repeated_rows` rows of the epoch's
    start again so every rank yields the same count (collectives stay in step)."""
    probe = PackedIterableDataset(many_groups, rank=0, world_size=world_size)
    N = probe.output.num_rows
    per_rank = epoch_rows(many_groups, world_size, num_workers)
    q = -(-N // world_size)
    assert [len(r) for r in per_rank] == [q] * world_size == [len(probe)] * world_size
    counts = Counter(i for r in per_rank for i in r)
    assert set(counts) == set(range(N))  # every row
    extra = sum(counts.values()) - N
    assert extra == probe.repeated_rows == world_size * q - N
    assert all(c <= 2 for c in counts.values()) and sum(c == 2 for c in counts.values()) == extra


@pytest.mark.parametrize("world_size,num_workers", [(2, 2), (3, 1), (8, 2)])
def test_drop_last_drops_exactly_the_counted_remainder(many_groups, world_size, num_workers):
    """drop_last=True: no row twice, exactly N - W * floor(N / W) rows left out."""
    per_rank = epoch_rows(many_groups, world_size, num_workers, drop_last=True)
    probe = PackedIterableDataset(many_groups, rank=0, world_size=world_size, drop_last=True)
    N = probe.output.num_rows
    flat = [i for r in per_rank for i in r]
    assert len(flat) == len(set(flat)) == N - probe.dropped_rows
    assert probe.dropped_rows == N % world_size
    assert [len(r) for r in per_rank] == [N // world_size] * world_size


@pytest.mark.parametrize("world_size,num_workers", [(3, 2), (8, 2)])
def test_ranks_make_the_same_number_of_batches_with_workers(many_groups, world_size,
                                                            num_workers):
    """Workers take equal contiguous runs of the rank's rows, so every rank makes the same
    number of (partial) batches and a DDP job does not wait on a rank that has finished."""
    counts = set()
    for rank in range(world_size):
        ds = PackedIterableDataset(many_groups, rank=rank, world_size=world_size, seed=2)
        dl = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate,
                                         num_workers=num_workers)
        counts.add(sum(1 for _ in dl))
    assert len(counts) == 1, counts


def test_fewer_rows_than_ranks_still_gives_every_rank_rows(tmp_path):
    """3 rows over 8 ranks: each rank yields 1 row, every row at least once, 5 repeats."""
    from loader_helpers import pack, write_input

    out = pack(write_input(tmp_path / "in", [[1, 2, 3, 4]] * 3), tmp_path / "out", 4)
    per_rank = epoch_rows(out, 8, 0)
    assert [len(r) for r in per_rank] == [1] * 8
    assert set(i for r in per_rank for i in r) == {0, 1, 2}


def test_epochs_differ_and_each_is_reproducible_from_seed_and_epoch(many_groups):
    """Same (seed, epoch): same order, in a fresh dataset; another epoch or seed: another
    order of the same rows."""
    e0 = epoch_rows(many_groups, 2, 2, epoch=0, seed=7)
    e0_again = epoch_rows(many_groups, 2, 2, epoch=0, seed=7)
    e1 = epoch_rows(many_groups, 2, 2, epoch=1, seed=7)
    other_seed = epoch_rows(many_groups, 2, 2, epoch=0, seed=8)
    assert e0 == e0_again
    assert e0 != e1 and e0 != other_seed
    assert sorted(sum(e0, [])) == sorted(sum(e1, []))


def test_set_epoch_changes_the_order_of_one_dataset(many_groups):
    """set_epoch on one dataset object gives that epoch's order (what Trainer calls)."""
    ds = PackedIterableDataset(many_groups, rank=0, world_size=1, seed=1)
    a = [it["index"] for it in ds]
    ds.set_epoch(1)
    b = [it["index"] for it in ds]
    fresh = PackedIterableDataset(many_groups, rank=0, world_size=1, seed=1, epoch=1)
    assert a != b and sorted(a) == sorted(b) and b == [it["index"] for it in fresh]


def test_each_rank_reads_a_contiguous_run_of_whole_row_groups(many_groups):
    """Ranks split the epoch's row-group order into contiguous ranges: over all ranks, row
    groups decoded = G + at most W - 1 shared at range ends (a stride would decode every group
    on every rank: G * W); inside a rank's range every group but the two at its ends is read
    whole."""
    from packtool.loader import plan

    for W in (2, 3, 8):
        decoded = 0
        for rank in range(W):
            ds = PackedIterableDataset(many_groups, rank=rank, world_size=W, drop_last=True,
                                       shuffle_buffer=1)
            groups = ds.groups_for()
            decoded += len(groups)
            rows = ds.rows_for()
            per_group = np.bincount(ds.output.group_of(rows), minlength=ds.output.num_row_groups)
            inner = groups[1:-1]
            assert np.array_equal(per_group[inner], ds.output.rg_rows[inner])
        G = ds.output.num_row_groups
        assert G <= decoded <= G + W - 1, (W, decoded, G)
        assert plan.split_ranks(ds.output.rg_rows, rank=0, world_size=W, seed=0, epoch=0,
                                drop_last=True).rows_per_rank == ds.output.num_rows // W


def test_items_match_random_access(many_groups):
    """An item from the stream is the row PackedDataset returns for the same global index."""
    from packtool.loader import PackedDataset

    ds = PackedDataset(many_groups)
    for it in PackedIterableDataset(many_groups, rank=1, world_size=3, seed=5):
        ref = ds[it["index"]]
        for k in ("input_ids", "labels", "segment_ids", "position_ids", "cu_seqlens"):
            assert np.array_equal(it[k], ref[k]), k
        assert (it["shard"], it["row"]) == (ref["shard"], ref["row"])


def test_shuffle_buffer_bounds_how_far_a_row_moves(many_groups):
    """Inside a worker, no row moves shuffle_buffer positions or more from its place in the
    row-group stream, so decoded row groups in memory stay bounded."""
    ds = PackedIterableDataset(many_groups, rank=0, world_size=1, seed=2, shuffle_buffer=5)
    shuffled = ds.rows_for(0, 1)
    ds_flat = PackedIterableDataset(many_groups, rank=0, world_size=1, seed=2, shuffle_buffer=1)
    stream = ds_flat.rows_for(0, 1)
    pos = {int(r): k for k, r in enumerate(stream)}
    moves = np.array([abs(k - pos[int(r)]) for k, r in enumerate(shuffled)])
    assert sorted(shuffled.tolist()) == sorted(stream.tolist())
    assert moves.max() < 5 and moves.max() > 0


def test_no_shuffle_reads_in_manifest_order(many_groups):
    """shuffle=False: one rank reads rows 0..N-1 in order (the sequential benchmark's path)."""
    ds = PackedIterableDataset(many_groups, rank=0, world_size=1, shuffle=False)
    assert [it["index"] for it in ds] == list(range(ds.output.num_rows))


def test_rank_defaults_come_from_torchrun_variables(many_groups, monkeypatch):
    """Without an initialised process group, RANK / WORLD_SIZE (set by torchrun) are used."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ds = PackedIterableDataset(many_groups)
    assert (ds.rank, ds.world_size) == (2, 4)


@pytest.mark.parametrize("kw", [dict(rank=2, world_size=2), dict(rank=-1, world_size=2),
                                dict(seed=-1), dict(shuffle_buffer=0), dict(epoch=-3)])
def test_bad_arguments_raise_value_error(many_groups, kw):
    kw = {"rank": 0, "world_size": 1, **kw}
    with pytest.raises(ValueError):
        PackedIterableDataset(many_groups, **kw)
