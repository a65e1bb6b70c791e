"""Whole batches from DataLoader workers through each worker's shared-memory ring
(packtool/loader/transfer.py): the same batches as by value and as without workers, batches
that are the training loop's own memory, nothing left in /dev/shm or mapped after a worker dies
or a DataLoader stops mid-epoch, and by value whenever shared memory is unavailable."""

from __future__ import annotations

import errno
import gc
import os
import signal

import numpy as np
import pytest

torch = pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from loader_helpers import many_groups  # noqa: F401

from packtool.loader import PackedIterableDataset, collate_flat, transfer

SHM = "/dev/shm"


def shm_names() -> set:
    """The ring files in /dev/shm (other programs' files come and go: not ours to check)."""
    names = os.listdir(SHM) if os.path.isdir(SHM) else []
    return {n for n in names if n.startswith("packtool-batches")}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def settled_fds(at_most: int | None, wait_s: float = 30.0) -> int:
    """Open descriptors once a finished DataLoader's own teardown is over: its queues and
    threads close theirs asynchronously (torch's, not packtool's), so the count is taken again,
    for up to ``wait_s``, until it is at most ``at_most`` (None: once, after a collection)."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        gc.collect()  # objects of earlier tests in cycles close their descriptors now
        n = open_fds()
        if at_most is None or n <= at_most or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def dataset(out, **kw):
    return PackedIterableDataset(out, rank=0, world_size=1, seed=4, batch_size=4, **kw)


def loader(ds, workers=2, **kw):
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, **kw)


def by_value(ds, monkeypatch, **kw):
    """The batches of 2 workers with the ring turned off (each worker reads the variable when
    it would make its ring)."""
    with monkeypatch.context() as m:
        m.setenv(transfer.ENV, "0")
        return list(loader(ds, **kw))


def assert_same_batches(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], torch.Tensor):
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
            elif k == "doc_ids":
                assert all(np.array_equal(x, y) for x, y in zip(a[k], b[k]))
            else:
                assert a[k] == b[k], k


def assert_rows_as_without_workers(got: list, ds) -> None:
    """Each row of each batch equals that row in the batches of a DataLoader without workers
    (batches group rows differently with 2 workers, so rows are compared)."""
    rows = {}
    for b in loader(ds, workers=0):
        for j, i in enumerate(b["index"]):
            rows[i] = {k: b[k][j] for k in ("input_ids", "labels", "position_ids",
                                              "segment_ids", "seq_idx")}
    seen = []
    for b in got:
        for j, i in enumerate(b["index"]):
            for k, v in rows[i].items():
                assert torch.equal(b[k][j], v), (i, k)
            seen.append(i)
    assert sorted(seen) == sorted(rows)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_ring_batches_equal_by_value_and_rows_equal_no_workers(many_groups, monkeypatch,
                                                               context):
    """2 persistent workers started with `context`, two epochs: most batches come through the
    rings (two rings, mapped once), and each equals the by-value batch byte for byte, each row
    the row of a DataLoader without workers."""
    ds = dataset(many_groups)
    want = by_value(ds, monkeypatch, multiprocessing_context=context)
    before = transfer.counts()
    dl = loader(ds, persistent_workers=True, multiprocessing_context=context)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        dl.dataset.set_epoch(epoch)
        got = list(dl)
        if epoch == 0:
            assert_same_batches(got, want)
        assert_rows_as_without_workers(got, ds)
    now = transfer.counts()
    assert now["rings_mapped"] - before["rings_mapped"] == 2
    shared = now["shared"] - before["shared"]
    assert shared >= 2 * len(want) - 8, now  # all but the first batch or two of each worker


def test_every_token_column_and_collate_flat_through_the_ring(many_groups, monkeypatch):
    """Four per-token columns read (stored structure) and collate_flat: the same batches."""
    ds = dataset(many_groups, structure="stored", collate_fn=collate_flat,
                 columns=["input_ids", "segment_ids", "position_ids", "labels", "cu_seqlens",
                          "doc_ids"])
    want = by_value(ds, monkeypatch)
    before = transfer.counts()["shared"]
    assert_same_batches(list(loader(ds)), want)
    assert transfer.counts()["shared"] > before


def test_batches_handed_out_are_not_views_of_the_ring(many_groups, monkeypatch):
    """Every batch of two epochs kept while the workers reuse their slots (one slot each, so
    each slot is overwritten by every later batch): none changes."""
    monkeypatch.setattr(transfer, "SLOTS", 1)
    ds = dataset(many_groups)
    want = by_value(ds, monkeypatch)
    dl = loader(ds, persistent_workers=True)
    kept = [list(dl), list(dl)]
    assert_same_batches(kept[0], want)
    assert_same_batches(kept[1], want)


def test_a_full_ring_sends_that_batch_by_value(many_groups, monkeypatch):
    """One slot per worker and four batches in flight: some batches find no free slot and
    cross by value; the worker never waits and every batch is the same."""
    monkeypatch.setattr(transfer, "SLOTS", 1)
    ds = dataset(many_groups)
    want = by_value(ds, monkeypatch, prefetch_factor=4)
    before = transfer.counts()
    got = list(loader(ds, prefetch_factor=4))
    now = transfer.counts()
    assert_same_batches(got, want)
    assert now["shared"] > before["shared"]
    assert now["by_value"] - before["by_value"] > 2  # more than each worker's first batch


def _drop_memfd(m):
    m.delattr(os, "memfd_create")


def _no_shared_memory(m):
    def refuse(size):
        raise OSError(errno.ENOENT, "no memfd_create and no /dev/shm")
    m.setattr(transfer, "_segment", refuse)


def _shm_full(m):
    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")
    m.setattr(os, "posix_fallocate", full)


@pytest.mark.parametrize("case,shared", [("env", False), ("no shared memory", False),
                                         ("/dev/shm full", False),
                                         ("/dev/shm without memfd", True)])
def test_without_shared_memory_every_batch_goes_by_value(many_groups, monkeypatch, case,
                                                         shared):
    """The ring turned off, no shared memory at all, or a full /dev/shm (fork workers inherit
    the patches): every batch by value, the same, no error. Without memfd a /dev/shm file
    (unlinked at once) serves, and nothing shows in /dev/shm."""
    ds = dataset(many_groups)
    want = by_value(ds, monkeypatch, multiprocessing_context="fork")
    names = shm_names()
    before = transfer.counts()
    with monkeypatch.context() as m:
        {"env": lambda m: m.setenv(transfer.ENV, "0"), "no shared memory": _no_shared_memory,
         "/dev/shm full": _shm_full, "/dev/shm without memfd": _drop_memfd}[case](m)
        got = []
        for b in loader(ds, multiprocessing_context="fork"):
            got.append(b)
            assert shm_names() == names
    now = transfer.counts()
    assert_same_batches(got, want)
    assert (now["shared"] > before["shared"]) == shared
    if not shared:
        assert now["by_value"] - before["by_value"] == len(want)


def _children() -> set:
    return {c.pid for c in psutil.Process().children()}


def test_killed_worker_and_stopped_loader_leave_nothing_behind(many_groups, monkeypatch):
    """A worker SIGKILLed mid-epoch (the DataLoader reports it) and a DataLoader abandoned
    mid-epoch: /dev/shm holds the same names before, during and after (also with the /dev/shm
    fallback), and once the next DataLoader's workers have sent their rings the training
    process maps only those: its file descriptors do not grow from one DataLoader to the
    next."""
    gc.collect()  # DataLoaders of earlier tests left in cycles stop their workers now
    ds = dataset(many_groups)
    names = shm_names()
    with monkeypatch.context() as m:
        _drop_memfd(m)  # the /dev/shm file: the case that could leave a name behind
        others = _children()  # e.g. a resource tracker: not workers
        dl = loader(ds, persistent_workers=True)
        it = iter(dl)
        for _ in range(3):
            next(it)
        assert shm_names() == names
        os.kill(min(_children() - others), signal.SIGKILL)
        with pytest.raises(RuntimeError, match="DataLoader worker"):
            for _ in range(100):
                next(it)
        del it, dl
        it = iter(loader(ds))
        for _ in range(3):
            next(it)
        del it
    assert shm_names() == names
    fds = []
    for _ in range(3):  # each DataLoader's rings replace the last one's
        got = list(loader(ds))
        fds.append(settled_fds(fds[-1] if fds else None))
        assert transfer.counts()["rings"] == 2, transfer.counts()
    assert fds[0] >= fds[1] >= fds[2], fds
    assert shm_names() == names
    assert_rows_as_without_workers(got, ds)
