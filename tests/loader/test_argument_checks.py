"""Arguments and states refused with the message that names the right thing: a negative epoch
is the epoch (not the seed), rows_per_epoch of outputs without rows says so, a row index that
is not an integer is a TypeError (as a list gives), and repeated_rows counts the epoch's
duplicates over every phase of an elastic resume."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packtool.loader import PackedDataset, PackedIterableDataset  # noqa: E402

from loader_helpers import many_groups  # noqa: E402,F401


def test_a_negative_epoch_is_named_the_epoch(many_groups):
    with pytest.raises(ValueError, match="^epoch must be a non-negative integer, got -1"):
        PackedIterableDataset(many_groups, epoch=-1)
    ds = PackedIterableDataset(many_groups)
    with pytest.raises(ValueError, match="^epoch must be a non-negative integer, got -3"):
        ds.set_epoch(-3)
    with pytest.raises(ValueError, match="^seed must be"):
        PackedIterableDataset(many_groups, seed=-2)


def test_rows_per_epoch_of_outputs_without_rows(many_groups, monkeypatch):
    """No weights were given, so the message is not about weights."""
    from packtool.formats.packed import PackedOutput

    monkeypatch.setattr(PackedOutput, "num_rows", property(lambda self: 0))
    with pytest.raises(ValueError, match="rows_per_epoch=10, but the outputs hold no rows"):
        PackedIterableDataset(many_groups, rows_per_epoch=10)


def test_row_indexes_are_integers(many_groups):
    ds = PackedDataset(many_groups)
    for bad in (3.0, True, np.bool_(False), "3"):
        with pytest.raises(TypeError, match="row indexes are integers"):
            ds[bad]
    assert ds[np.int64(3)]["index"] == ds[3]["index"] == 3
    assert ds[np.int32(-1)]["index"] == len(ds) - 1


def test_row_indexes_from_torch_samplers_are_taken(many_groups):
    """SubsetRandomSampler(torch.arange(n)) and sampler=torch.randperm(n) yield 0-d integer
    tensors, which a list takes as indexes: the dataset refused them ("row indexes are
    integers, not Tensor"), so such a DataLoader failed at its first batch. A float, a bool
    or a bool tensor is still refused."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, SubsetRandomSampler

    from packtool.loader import collate

    ds = PackedDataset(many_groups)
    assert ds[torch.tensor(3)]["index"] == 3 and ds[torch.tensor(-1)]["index"] == len(ds) - 1
    for bad in (torch.tensor(True), torch.tensor(2.0)):
        with pytest.raises(TypeError, match="row indexes are integers"):
            ds[bad]
    picked = torch.arange(10)
    for sampler in (SubsetRandomSampler(picked), torch.randperm(10)):
        dl = DataLoader(ds, batch_size=3, sampler=sampler, collate_fn=collate)
        seen = sorted(i for b in dl for i in b["index"])
        assert seen == list(range(10)), seen


def test_repeated_rows_counts_every_phase_of_the_epoch(many_groups):
    """4 ranks x 2 workers (3 even-up repeats of 153 rows) stop after 5 rows per worker; one
    process without workers reads the rest: the epoch's duplicates over both runs are what
    repeated_rows says after the resume."""
    n = len(PackedDataset(many_groups))
    before, state = [], None
    for rank in range(4):
        ds = PackedIterableDataset(many_groups, rank=rank, world_size=4, seed=1)
        for w in range(2):
            before += ds.rows_for(w, 2)[:5].tolist()
        state = state or {**ds.state_dict(), "worker": None, "num_workers": 2,
                          "yielded": [5, 5]}
    repeats4 = 4 * -(-n // 4) - n
    assert repeats4 > 0
    rest = PackedIterableDataset(many_groups, seed=1)
    rest.load_state_dict(state)
    after = [int(x["index"]) for x in rest]
    dup = sum(v - 1 for v in Counter(before + after).values())
    assert set(before + after) == set(range(n))
    assert rest.repeated_rows == dup == repeats4


@pytest.mark.parametrize("value", [2.5, 2.0, "2", True, 0])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused(many_groups, value):
    """2.5 was cut to 2 silently."""
    with pytest.raises(ValueError, match="^batch_size must be a positive integer or None"):
        PackedIterableDataset(many_groups, batch_size=value)
    assert PackedIterableDataset(many_groups, batch_size=np.int64(2)).batch_size == 2


def test_len_of_one_workers_state_of_several_says_what_it_cannot_count(many_groups):
    """A single worker's state of 2 workers, loaded into the training process's dataset: len()
    cannot count the rest of the epoch (it does not know the other worker), and says so rather
    than name a resume shape nobody asked for."""
    ds = PackedIterableDataset(many_groups, world_size=2, rank=0, seed=1)
    state = dict(ds.state_dict(), num_workers=2, worker=0, yielded=3)
    ds.load_state_dict(state)
    with pytest.raises(ValueError, match="worker 0's of 2: .* so len\\(\\) and the row counts "
                                         "cannot count the rest of the epoch from it"):
        len(ds)
