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
