"""Batch arrays reused by the training process: never while anything refers to them (a tensor,
a view, an array made from a tensor, a batch kept by the loop), always once released, within
their caps; and batches kept over a whole epoch, or changed in place, equal fresh ones."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from loader_helpers import many_groups  # noqa: F401

from packtool.loader import PackedIterableDataset
from packtool.loader.pool import ArrayPool


def test_an_array_is_reused_only_once_nothing_refers_to_it():
    pool = ArrayPool(keep=2)
    a = pool.empty((3, 5), np.int64)
    holders = {
        "tensor": lambda x: torch.from_numpy(x),
        "tensor view": lambda x: torch.from_numpy(x)[1:],
        "reshaped tensor": lambda x: torch.from_numpy(x).reshape(-1),
        "numpy of a tensor": lambda x: torch.from_numpy(x).numpy(),
        "numpy view": lambda x: x[:, 2],
        "memoryview": lambda x: memoryview(x),
    }
    for name, make in holders.items():
        kept = make(a)
        ids = id(a)
        del a
        b = pool.empty((3, 5), np.int64)  # a is held: another array
        c = pool.empty((3, 5), np.int64)  # the pool is full (keep=2): a fresh one
        assert id(b) != ids and id(c) != ids, name
        assert not np.shares_memory(np.asarray(b), np.asarray(kept)), name
        del kept, b, c
        a = pool.empty((3, 5), np.int64)
        assert id(a) == ids, f"{name}: released, the array comes back"
    assert pool.empty((3, 5), np.int32).dtype == np.int32  # another key, another array
    assert pool.empty((5, 3), np.int64).shape == (5, 3)


def test_caps_and_arguments():
    pool = ArrayPool(keep=8, max_bytes=1000)
    held = [pool.empty((100,), np.int64) for _ in range(3)]  # 800 bytes each: one kept
    assert pool._bytes == 800
    del held
    none = ArrayPool(keep=0)
    x = none.empty((4,), np.int32)
    del x
    assert none._bytes == 0 and not any(none._arrays.values())
    with pytest.raises(ValueError, match="keep and max_bytes must be >= 0"):
        ArrayPool(keep=-1)


def test_threads_never_share_an_array():
    """Threads taking and dropping arrays at once (the pin-memory thread collates beside the
    loop): no two live holders ever get the same array."""
    pool = ArrayPool(keep=4)
    errors = []

    def work(tag: int):
        for _ in range(2000):
            a = pool.empty((64,), np.int64)
            a[:] = tag
            if not (a == tag).all():
                errors.append(tag)
            del a

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_kept_or_changed_in_place_equal_fresh_ones(many_groups, workers):
    """Two epochs through a DataLoader: every batch is kept (the pool must not hand out their
    arrays again) and compared at the end with copies taken on arrival; a second pass drops
    each batch after zeroing its tensors in place, and still equals the first (every reused
    element is written again)."""
    ds = PackedIterableDataset(many_groups, rank=0, world_size=1, seed=2, batch_size=4)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                     multiprocessing_context="fork" if workers else None)
    tensors = ("input_ids", "labels", "position_ids", "segment_ids", "seq_idx", "cu_seqlens")
    kept, copies = [], []
    for epoch in range(2):
        ds.set_epoch(epoch)
        for b in dl:
            kept.append(b)
            copies.append({k: b[k].clone() for k in tensors})
    for b, c in zip(kept, copies):
        for k in tensors:
            assert torch.equal(b[k], c[k]), k
    del kept
    ds.set_epoch(0)
    n = len(copies) // 2
    got = 0
    for b, c in zip(dl, copies[:n]):
        for k in tensors:
            assert torch.equal(b[k], c[k]), k
            b[k].zero_()  # the loop writes into its batch, then drops it
        got += 1
    assert got == n > 4


def test_a_worker_batch_crosses_by_value_doc_ids_included(many_groups):
    """A batch collated in a DataLoader worker pickles its tensors, and its list of doc_ids
    tensors, by value (torch would give each storage its own shared-memory segment)."""
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from packtool.loader.collate import _Batch

    ds = PackedIterableDataset(many_groups, rank=0, world_size=1, batch_size=4)
    batch = next(iter(ds))
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(_Batch(batch))
    assert b"rebuild_storage" not in buf.getvalue()
    back = pickle.loads(buf.getvalue())
    assert back.keys() == batch.keys()
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(back[k], v), k
    assert all(torch.equal(a, b) for a, b in zip(back["doc_ids"], batch["doc_ids"]))
