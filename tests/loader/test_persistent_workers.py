"""Persistent DataLoader workers keep the dataset copies they started with: set_epoch (and a
finished epoch's state loaded in the training process) must still reach them, or every epoch
repeats the first one's order."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from loader_helpers import many_groups  # noqa: F401

from packtool.loader import PackedIterableDataset


def order(dl) -> list:
    return [int(i) for b in dl for i in b["index"]]


def dataset(out, **kw):
    return PackedIterableDataset(out, rank=0, world_size=1, seed=7, batch_size=4, **kw)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_set_epoch_reaches_persistent_workers(many_groups, context):
    ds = dataset(many_groups)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True,
                                     multiprocessing_context=context)
    fresh = {}
    for epoch in (0, 1, 2, 1):
        ds.set_epoch(epoch)
        got = order(dl)
        want = fresh.setdefault(epoch, order(torch.utils.data.DataLoader(
            dataset(many_groups, epoch=epoch), batch_size=None, num_workers=2,
            multiprocessing_context="fork")))
        assert got == want, epoch
        assert sorted(got) == list(range(len(ds.output)))
    assert fresh[0] != fresh[1] != fresh[2]
    # a state saved at the end of epoch 2 (a run without workers), loaded in the training
    # process: the workers go on with epoch 3
    done = dataset(many_groups, epoch=2)
    assert len(order(done)) == len(ds.output)
    ds.load_state_dict(done.state_dict())
    assert ds.epoch == 3
    assert order(dl) == order(torch.utils.data.DataLoader(
        dataset(many_groups, epoch=3), batch_size=None, num_workers=2,
        multiprocessing_context="fork"))


@pytest.mark.parametrize("workers,batch", [(0, 4), (1, 5), (2, 5), (3, 8), (2, None)])
def test_num_batches_counts_what_a_dataloader_yields(many_groups, workers, batch):
    """len(ds) is a DataLoader without workers; num_batches(K) is what K workers yield (each
    ends on its own partial batch), also for the rest of an epoch after a resume point."""
    ds = PackedIterableDataset(many_groups, rank=1, world_size=2, seed=1, batch_size=batch)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers,
                                     multiprocessing_context="fork" if workers else None)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when more batches come than len() said
        got = sum(1 for _ in dl)
    assert ds.num_batches(workers) == got
    if workers == 0:
        assert len(ds) == got
    part = PackedIterableDataset(many_groups, rank=1, world_size=2, seed=1, batch_size=batch)
    it = iter(part)
    for _ in range(3):
        next(it)
    state = part.state_dict()
    rest = PackedIterableDataset(many_groups, rank=1, world_size=2, seed=1, batch_size=batch)
    rest.load_state_dict(state)
    assert rest.num_batches(0) == sum(1 for _ in rest) == len(ds) - 3


def test_the_training_process_state_warns_when_workers_read(many_groups):
    """ds.state_dict() in the training process after its DataLoader's workers yielded rows
    would replay them on resume: it warns; without workers, or after set_epoch, it does not."""
    import warnings

    ds = dataset(many_groups)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                          multiprocessing_context="fork"))
    for _ in range(3):
        next(it)
    with pytest.warns(UserWarning, match="StatefulDataLoader"):
        assert ds.state_dict()["yielded"] == 0
    del it
    ds.set_epoch(1)
    plain = dataset(many_groups)
    for _ in zip(range(3), plain):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.state_dict()
        assert plain.state_dict()["yielded"] == 12


@pytest.mark.parametrize("before", ["a peek", "a loaded state"])
def test_the_training_process_state_warns_whatever_it_read_itself(many_groups, before):
    """The training process reads one batch itself (a peek) or loads a mid-epoch state, then
    its DataLoader's workers yield rows: its state_dict() would replay what they consumed, so
    it warns (it did not once it had yielded a row itself, or held a loaded state). A state
    loaded after the workers read does not warn: it is the state loaded."""
    import warnings

    ds = dataset(many_groups)
    if before == "a peek":
        next(iter(ds))
    else:
        part = dataset(many_groups)
        for _ in zip(range(2), part):
            pass
        ds.load_state_dict(part.state_dict())
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                          multiprocessing_context="fork"))
    for _ in range(4):
        next(it)
    with pytest.warns(UserWarning, match="DataLoader workers yielded rows of this epoch"):
        ds.state_dict()
    del it
    part = dataset(many_groups)
    for _ in zip(range(2), part):
        pass
    ds.load_state_dict(part.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ds.state_dict()["yielded"] == 8  # 2 batches of 4 rows


_EXIT_WITH_WORKERS = """
import sys, torch
from packtool.loader import PackedIterableDataset

for _ in range(2):
    ds = PackedIterableDataset(sys.argv[1], rank=0, world_size=1, seed=7, read_ahead=2)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                     persistent_workers=True, multiprocessing_context="fork")
    for epoch in range(2):
        ds.set_epoch(epoch)
        for _ in dl:
            pass
"""


def test_persistent_workers_end_quietly_when_the_training_process_exits(many_groups):
    """A script that leaves persistent workers running when it exits: Python's multiprocessing
    terminates them, and torch's SIGTERM handler in each worker ends it with status 0. The
    read-ahead's waits (``read_ahead``) replaced that handler with the default action, so the
    workers died by the signal and torch printed "Exception ignored in atexit callback ...
    DataLoader worker (pid N) is killed by signal: Terminated" (exit status still 0)."""
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", _EXIT_WITH_WORKERS, str(many_groups)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "killed by signal" not in p.stderr, p.stderr
        assert "Exception ignored" not in p.stderr, p.stderr
