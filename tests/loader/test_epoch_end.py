"""A checkpoint taken at the end of an epoch (right after its last row or batch, or after the
DataLoader's StopIteration) starts the next epoch, complete and in the order an uninterrupted
run yields it, with 0 to 3 DataLoader workers, rows or whole batches, one output or a mixture,
loaded through the StatefulDataLoader or into the dataset, before or after ``set_epoch``.

With several workers torchdata hands each worker only its own state, which cannot say whether
its siblings were done too; a checkpoint one batch before the end must still resume the last
batch, not the next epoch. A loader resumed from the state after the last batch goes on with
its round robin where it stopped: when the workers' runs are uneven the next epoch's batches
come from the workers in rotated turn (each worker's the same, in the same order)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

from packtool.loader import PackedIterableDataset  # noqa: E402

from loader_helpers import rows_120, web_and_code  # noqa: E402,F401

CASES = {  # name: (dataset keywords, fixture)
    "rows": (dict(), "rows_120"),
    "batches": (dict(batch_size=4), "rows_120"),
    "mixture rows": (dict(weights={"web": 2, "code": 1}, rows_per_epoch=45), "web_and_code"),
    "mixture batches": (dict(weights={"web": 2, "code": 1}, rows_per_epoch=45, batch_size=4),
                        "web_and_code"),
}


def keys(item):
    """The rows of an item or batch, as (source, index) pairs."""
    if isinstance(item["index"], list):
        return list(zip(item["source"], item["index"]))
    return [(item["source"], int(item["index"]))]


def stream(loader):
    return [keys(b) for b in loader]


def turns(ds, workers, first):
    """The batches of ``ds``'s current epoch as a DataLoader with ``workers`` workers yields
    them when its round robin starts at worker ``first``."""
    K = max(1, workers)
    B = ds.batch_size or 1
    names, base = ds.sources, ds.mixture.row_base
    runs = []
    for w in range(K):
        rows = [(names[s], int(k - base[s])) for k in ds.rows_for(w, K).tolist()
                for s in [int((base <= k).sum()) - 1]]
        runs.append([rows[i:i + B] for i in range(0, len(rows), B)])
    out, order = [], [(first + i) % K for i in range(K)]
    while any(runs):
        for w in order:
            if runs[w]:
                out.append(runs[w].pop(0))
    return out


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_an_end_of_epoch_checkpoint_starts_the_next_epoch(case, workers, request):
    kw, fixture = CASES[case]
    out = request.getfixturevalue(fixture)

    def make():
        ds = PackedIterableDataset(out, rank=1, world_size=2, seed=5, shuffle_buffer=8, **kw)
        return ds, stateful.StatefulDataLoader(ds, batch_size=None, num_workers=workers)

    ds, dl = make()
    it = iter(dl)
    epoch0, states = [], []
    for b in it:
        epoch0.append(keys(b))
        states.append(copy.deepcopy(dl.state_dict()))
    after_stop = copy.deepcopy(dl.state_dict())
    ds.set_epoch(1)
    epoch1 = stream(dl)  # the uninterrupted run's next epoch
    assert epoch1 and epoch1 != epoch0 and epoch1 == turns(ds, workers, 0)
    last = states[-1]
    # a loader resumed from the last batch's state goes on from the worker after that batch's
    snap = last.get("_snapshot", {})
    turn = (snap.get("_last_yielded_worker_id", -1) + 1) % max(1, workers)
    go_on = turns(ds, workers, turn)
    assert sorted(go_on) == sorted(epoch1)

    # through the loader: set_epoch(1) before loading, after loading, or not at all
    for state, when in ((last, "before"), (last, None), (after_stop, "after"),
                        (after_stop, None)):
        ds, dl = make()
        if when == "before":
            ds.set_epoch(1)
        dl.load_state_dict(state)
        if when == "after":
            ds.set_epoch(1)
        assert stream(dl) == (go_on if state is last else epoch1), when
    # into the dataset (the whole loader state), then a new loader
    ds, dl = make()
    ds.load_state_dict(last)
    assert ds.epoch == 1
    assert stream(dl) == epoch1
    # one batch before the end: only the last batch is left, whichever worker holds it
    if len(states) > 1:
        ds, dl = make()
        dl.load_state_dict(states[-2])
        assert stream(dl) == epoch0[-1:]


# --- a DataLoader that batches items itself ---------------------------------------------------

BATCHING = {  # name: (dataset keywords, fixture); rank 1 of 2: 60 and 22 rows
    "one output": (dict(), "rows_120"),
    "mixture": (dict(weights={"web": 2, "code": 1}, rows_per_epoch=45), "web_and_code"),
}


def batching(out, kw, *, batch, workers, drop_last=False, persistent=False, on_dataset=False):
    """A dataset and a StatefulDataLoader over it; ``on_dataset``: the dataset builds the
    batches (``batch_size=None`` on the DataLoader), else the DataLoader batches items with
    ``collate``."""
    from packtool.loader import collate

    if on_dataset:
        ds = PackedIterableDataset(out, rank=1, world_size=2, seed=5, batch_size=batch, **kw)
        loader_kw = dict(batch_size=None)
    else:
        ds = PackedIterableDataset(out, rank=1, world_size=2, seed=5, **kw)
        loader_kw = dict(batch_size=batch, collate_fn=collate, drop_last=drop_last)
    return ds, stateful.StatefulDataLoader(ds, num_workers=workers,
                                           persistent_workers=persistent and workers > 0,
                                           **loader_kw)


def saved_at_the_end(make, *, after_stop):
    """Epoch 0 in full, and the state a loop saves right after its last batch (``after_stop``:
    after the DataLoader's StopIteration)."""
    _, dl = make()
    rows, state = [], None
    for b in dl:
        rows += keys(b)
        state = copy.deepcopy(dl.state_dict())
    return rows, copy.deepcopy(dl.state_dict()) if after_stop else state


def train(make, state, epochs=(1, 2)):
    """The rows of each epoch of a loop resumed from ``state`` (set_epoch, then one pass)."""
    ds, dl = make()
    dl.load_state_dict(state)
    out = []
    for e in epochs:
        ds.set_epoch(e)
        out.append([k for b in dl for k in keys(b)])
    return out


def uninterrupted(make, epoch):
    ds, dl = make()
    ds.set_epoch(epoch)
    return [k for b in dl for k in keys(b)]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers, drop_last, cause", [
    (0, False, "batches items itself"),   # torchdata restores its fetcher as ended
    (0, True, "drop_last=True"),          # the dropped rows are still to come
    (2, True, "drop_last=True"),
])
@pytest.mark.parametrize("case", list(BATCHING))
def test_an_epoch_skipped_after_resuming_warns_naming_the_cause_and_the_fix(
        case, workers, drop_last, cause, request):
    """A StatefulDataLoader without workers that batches items itself, when the rank's rows are
    not divisible by its batch size, restores the state saved after the epoch's short last batch
    with its fetcher ended: the first pass after loading is empty whatever the dataset does, and
    a loop going on with set_epoch(e + 2) would skip epoch e + 1 in silence. The same happens
    when a DataLoader with drop_last=True leaves rows that the resumed pass drops again."""
    kw, fixture = BATCHING[case]
    out = request.getfixturevalue(fixture)

    def make():
        return batching(out, kw, batch=4 if case == "mixture" else 7, workers=workers,
                        drop_last=drop_last)

    _, state = saved_at_the_end(make, after_stop=False)
    with pytest.warns(UserWarning, match="epoch 1 is skipped") as record:
        first, second = train(make, state)
    assert first == [] and second == uninterrupted(make, 2)  # torchdata's, not the dataset's
    message = " ".join(str(w.message) for w in record if "skipped" in str(w.message))
    assert cause in message and "StopIteration" in message
    if cause == "batches items itself":
        assert "batch_size=None" in message  # the other fix: batches built by the dataset


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("workers, drop_last, persistent, on_dataset, after_stop", [
    (0, False, False, True, False),   # batches built by the dataset
    (2, False, True, True, False),
    (0, False, False, False, True),   # the state saved after the DataLoader's StopIteration
    (0, True, False, False, True),
    (2, True, False, False, True),
    (2, True, True, False, True),     # persistent workers once replayed the finished epoch
    (1, False, False, False, False),  # workers: torchdata asks the dataset again
])
@pytest.mark.parametrize("case", list(BATCHING))
def test_the_documented_ways_resume_the_next_epoch_in_full(
        case, workers, drop_last, persistent, on_dataset, after_stop, request):
    """The fixes the warning names work: batches built by the dataset, or the state saved after
    the DataLoader's StopIteration, start epoch 1 at its first row (the rows an uninterrupted
    run yields), with or without persistent workers, and warn nothing."""
    import warnings

    kw, fixture = BATCHING[case]
    out = request.getfixturevalue(fixture)

    def make():
        return batching(out, kw, batch=4 if case == "mixture" else 7, workers=workers,
                        drop_last=drop_last, persistent=persistent, on_dataset=on_dataset)

    epoch0, state = saved_at_the_end(make, after_stop=after_stop)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="epoch .* is skipped")
        got = train(make, state)
    want = [uninterrupted(make, 1), uninterrupted(make, 2)]
    assert got[0] and got[0] != epoch0
    if workers <= 1:
        assert got == want
    else:  # the same rows; the round robin may start at another worker
        assert [sorted(g) for g in got] == [sorted(w) for w in want]
