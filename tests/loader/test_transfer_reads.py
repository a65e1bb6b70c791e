"""Code that runs in a DataLoader worker on what a batched PackedIterableDataset yields (a
DataLoader collate_fn with batch_size=None, a wrapping IterableDataset) sees the batch dict
(packtool/loader/transfer.py, _InTransit): the same batches as without workers, edits kept;
an item nothing reads still crosses through the ring; no slot kept or given back twice; resume
unchanged."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from loader_helpers import many_groups, rows_120, stop_and_resume  # noqa: F401

from packtool.loader import PackedIterableDataset, transfer


def dataset(out, **kw):
    """Batches of 4; read in order, so 2 workers (each a contiguous half of the rows) make the
    batches of none when 8 divides the rows."""
    kw.setdefault("shuffle", False)
    return PackedIterableDataset(out, rank=0, world_size=1, seed=4, batch_size=4, **kw)


def batches(ds, workers, **kw) -> list:
    return list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, **kw))


def assert_same(a, b) -> None:
    """Equal values of equal types (tensors: equal dtypes and elements), recursively."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def assert_as_without_workers(got: list, want: list, key) -> None:
    """The batches of 2 workers are those of none, batch for batch (matched by ``key``: the
    rows of each batch; the workers' batches come interleaved)."""
    mine = {key(b): b for b in got}
    theirs = {key(b): b for b in want}
    assert len(mine) == len(got) and mine.keys() == theirs.keys()
    for k, b in mine.items():
        assert_same(b, theirs[k])


def by_index(b) -> tuple:
    return tuple(b["index"])


def edit(b):
    """A per-batch hook: adds, replaces, changes in place, deletes."""
    b["flag"] = 1
    b["input_ids"] = b["input_ids"].long()
    b["labels"][:, 0] = -100
    del b["seq_idx"]
    b.update(step=len(b))
    return b


def test_a_collate_fn_that_edits_the_batch(rows_120):
    """120 rows, 2 workers of 60 rows: the same 30 batches as without workers, edits kept,
    every batch collated in its worker."""
    ds = dataset(rows_120)
    before = transfer.counts()
    got = batches(ds, 2, collate_fn=edit)
    done = transfer.counts()["collated_in_worker"] - before["collated_in_worker"]
    assert len(got) == 30 and done == 30
    assert all(b["flag"] == 1 and "seq_idx" not in b for b in got)
    assert_as_without_workers(got, batches(ds, 0, collate_fn=edit), by_index)


def first_column(b):
    return b["input_ids"]


def test_a_collate_fn_that_returns_part_of_the_batch(rows_120):
    ds = dataset(rows_120)
    got = batches(ds, 2, collate_fn=first_column)
    want = batches(ds, 0, collate_fn=first_column)
    assert all(t.dtype == torch.int32 for t in got)
    assert_as_without_workers(got, want, lambda t: tuple(t[:, 0].tolist()))


class Reads(torch.utils.data.IterableDataset):
    """A wrapping dataset: reads keys of each batch, yields a dict of its own, or (``whole``)
    the batch itself."""

    def __init__(self, ds, whole: bool = False) -> None:
        self.ds, self.whole = ds, whole

    def __iter__(self):
        for b in self.ds:
            if self.whole:
                assert "labels" in b and b.get("nothing", 7) == 7
                yield b
                continue
            mine = {k: v for k, v in b.items() if k != "doc_ids"}
            mine["n"] = len(b)
            mine["keys"] = sorted(b.keys())
            mine["copy"] = copy.copy(b)["num_targets"]
            mine["deep"] = copy.deepcopy(b)["input_ids"]
            mine["doc_ids"] = dict(b)["doc_ids"]
            yield mine


@pytest.mark.parametrize("whole", [False, True])
def test_a_wrapping_dataset_that_reads_the_batch(rows_120, whole):
    ds = dataset(rows_120)
    got = batches(Reads(ds, whole), 2)
    assert len(got) == 30
    assert_as_without_workers(got, batches(Reads(ds, whole), 0), by_index)


class EveryOther:
    """Edits a worker's 1st, 3rd, 5th... batch, returns the others untouched; checks in the
    worker that the ring holds no slot twice."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, b):
        self.n += 1
        ring = transfer._worker.ring
        assert ring is None or len(set(ring.free)) == len(ring.free), ring.free
        if self.n % 2:
            b["flag"] = self.n
        return b


def test_untouched_batches_still_use_the_ring_and_no_slot_leaks(many_groups, monkeypatch):
    """Each worker's first batch (which brings its ring) and every other one read in the
    worker, the rest not: the untouched ones still come through the rings (a slot kept by a
    read batch would leave a worker with none after SLOTS reads), and every batch equals the
    one built in the training process, with the edit where it was made."""
    ds = dataset(many_groups, shuffle=True)
    plain = batches(ds, 2, persistent_workers=True)
    before = transfer.counts()
    got = batches(ds, 2, collate_fn=EveryOther(), persistent_workers=True)
    now = transfer.counts()
    touched = [b for b in got if "flag" in b]
    assert now["rings_mapped"] - before["rings_mapped"] == 2
    assert now["collated_in_worker"] - before["collated_in_worker"] == len(touched)
    untouched = len(got) - len(touched)
    assert untouched >= 2 * transfer.SLOTS
    assert now["shared"] - before["shared"] >= untouched - 2, (now, before)
    assert len(got) == len(plain)
    for b, p in zip(got, plain):
        if "flag" in b:
            p["flag"] = b["flag"]
        assert_same(b, p)


def test_resume_with_a_collate_fn_that_reads_in_the_worker(many_groups):
    """A StatefulDataLoader stopped after 5 batches, each edited in the worker, and restarted:
    the batches of an uninterrupted run."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        return stateful.StatefulDataLoader(dataset(many_groups, shuffle=True), batch_size=None,
                                           num_workers=2, collate_fn=edit)

    full, head, rest, _ = stop_and_resume(make, 5)
    assert len(head) + len(rest) == len(full)
    for a, b in zip(head + rest, full):
        assert_same(a, b)
    assert np.array_equal(np.sort(np.concatenate([b["index"] for b in full])),
                          np.sort(np.concatenate([b["index"] for b in head + rest])))
