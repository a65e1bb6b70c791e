"""Elastic resume: a job checkpointed at one world size and worker count continues at another
with the rest of the epoch exactly (every row of the epoch once over both runs), from the state
of one rank; a checkpoint taken at an epoch's end starts the next epoch with 0, 1 and 2
workers."""

from __future__ import annotations

import copy
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

from packtool.loader import PackedIterableDataset, collate  # noqa: E402

from loader_helpers import many_groups, rows_120, web_and_code  # noqa: E402,F401


def run_ranks(out, world, workers, *, batches=None, state=None, seed=4, **kw):
    """Each rank's rows through a StatefulDataLoader (batches of 3), the first ``batches``
    batches per rank (all when None), optionally after loading ``state`` into each rank's
    dataset. Returns (rows of all ranks, rank 0's loader state)."""
    rows, state0 = [], None
    for rank in range(world):
        ds = PackedIterableDataset(out, rank=rank, world_size=world, seed=seed, **kw)
        if state is not None:
            ds.load_state_dict(state)
        loader = stateful.StatefulDataLoader(ds, batch_size=3, collate_fn=collate,
                                             num_workers=workers)
        it = iter(loader)
        for k, b in enumerate(it):
            rows += [(s, i) for s, i in zip(b["source"], b["index"])]
            if batches is not None and k + 1 == batches:
                break
        if rank == 0:
            state0 = loader.state_dict()
        del it, loader
    return rows, state0


def _all_rows(out, **kw):
    ds = PackedIterableDataset(out, rank=0, world_size=1, seed=4, **kw)
    return [(it["source"], it["index"]) for it in ds]


def test_2x2_resumes_at_3x1_with_every_row_of_the_epoch_once(rows_120):
    """2 ranks x 2 workers stop after 5 batches each; 3 ranks x 1 worker load rank 0's
    DataLoader state and finish the epoch: every row exactly once over both runs, no row of
    the rest of the epoch lost or repeated; then a second resize (3x1 -> 1x0) mid-rest."""
    before, state = run_ranks(rows_120, 2, 2, batches=5)
    assert len(before) == 2 * 5 * 3
    middle, state2 = run_ranks(rows_120, 3, 1, batches=4, state=state)
    assert len(middle) == 3 * 4 * 3
    after, _ = run_ranks(rows_120, 1, 0, state=state2)
    everything = Counter(before + middle + after)
    assert everything == Counter(_all_rows(rows_120))
    assert set(everything.values()) == {1}


def test_4x0_resumes_at_2x2_with_every_row_of_the_epoch_once(rows_120):
    """4 ranks without workers read 7 rows each (the dataset's own state, rank 0's); 2 ranks x
    2 workers load it and read the rest: every row once. The next epoch is the 2-rank epoch
    a job that always ran at 2 x 2 reads."""
    before, state0 = [], None
    for rank in range(4):
        ds = PackedIterableDataset(rows_120, rank=rank, world_size=4, seed=4)
        it = iter(ds)
        before += [(x["source"], x["index"]) for x in (next(it) for _ in range(7))]
        if rank == 0:
            state0 = ds.state_dict()
    after, _ = run_ranks(rows_120, 2, 2, state=state0)
    assert Counter(before + after) == Counter(_all_rows(rows_120))
    assert len(before + after) == 120
    resumed = PackedIterableDataset(rows_120, rank=1, world_size=2, seed=4)
    resumed.load_state_dict(state0)
    resumed.set_epoch(1)
    fresh = PackedIterableDataset(rows_120, rank=1, world_size=2, seed=4, epoch=1)
    assert [x["index"] for x in resumed] == [x["index"] for x in fresh]


def test_a_mixture_resumes_elastically(web_and_code):
    """A two-source mixture (0.6 / 0.4 of 90 rows) at 3 ranks x 1 worker, resumed at 2 x 2:
    the epoch's rows of each source exactly once overall, each source its exact share."""
    kw = dict(weights={"web": 0.6, "code": 0.4}, rows_per_epoch=90)
    before, state = run_ranks(web_and_code, 3, 1, batches=4, **kw)
    after, _ = run_ranks(web_and_code, 2, 2, state=state, **kw)
    everything = Counter(before + after)
    assert everything == Counter(_all_rows(web_and_code, **kw))
    assert Counter(s for s, _ in before + after) == {"web": 54, "code": 36}


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_checkpoint_at_the_end_of_an_epoch_starts_the_next_one(rows_120, workers):
    """The state saved after the last batch of epoch 0 (before the loader's StopIteration, as a
    loop that checkpoints after every step saves it) or after StopIteration, loaded by a
    restarted job that calls set_epoch(1), yields epoch 1 exactly as an uninterrupted job does,
    never epoch 0 again and never nothing, with 0, 1 and 2 workers, through the loader or the
    dataset. (torchdata discards a state taken after StopIteration and starts afresh from the
    dataset as it is; only the state taken after the last batch reaches the workers.)"""
    def loader(epoch):
        ds = PackedIterableDataset(rows_120, rank=0, world_size=2, seed=4)
        ds.set_epoch(epoch)
        return ds, stateful.StatefulDataLoader(ds, batch_size=5, collate_fn=collate,
                                               num_workers=workers)

    ds0, dl0 = loader(0)
    epoch0 = []
    for b in dl0:
        epoch0 += b["index"]
        last = copy.deepcopy(dl0.state_dict())
    after_stop = dl0.state_dict()
    _, fresh1 = loader(1)
    epoch1 = [i for b in fresh1 for i in b["index"]]
    assert sorted(epoch0) != epoch0 and epoch0 != epoch1
    for state in (last, after_stop):
        ds, dl = loader(0)
        dl.load_state_dict(state)
        ds.set_epoch(1)
        assert [i for b in dl for i in b["index"]] == epoch1
        ds, dl = loader(0)
        ds.load_state_dict(state)
        assert ds.epoch == 1
        ds.set_epoch(1)
        assert [i for b in dl for i in b["index"]] == epoch1


def test_a_rest_the_new_ranks_do_not_divide_is_evened_up_and_counted(rows_120):
    """2 ranks read 7 rows each; 4 ranks take the remaining 106 rows: 27 each, the 2 extra rows
    repeated from the start of the rest and counted in repeated_rows (drop_last=True: the last
    2 left out, counted in dropped_rows), every row of the epoch at least once."""
    before, state = [], None
    for rank in range(2):
        ds = PackedIterableDataset(rows_120, rank=rank, world_size=2, seed=4)
        it = iter(ds)
        before += [x["index"] for x in (next(it) for _ in range(7))]
        state = state or ds.state_dict()
    after = []
    for rank in range(4):
        ds = PackedIterableDataset(rows_120, rank=rank, world_size=4, seed=4)
        ds.load_state_dict(state)
        assert (ds.rows_per_rank, ds.repeated_rows, ds.dropped_rows) == (27, 2, 0)
        after += [x["index"] for x in ds]
    counts = Counter(before + after)
    assert set(counts) == set(range(120)) and sum(counts.values()) == 122
    dropped = PackedIterableDataset(rows_120, rank=0, world_size=4, seed=4, drop_last=True)
    state_dl = PackedIterableDataset(rows_120, rank=0, world_size=2, seed=4, drop_last=True)
    it = iter(state_dl)
    [next(it) for _ in range(7)]
    dropped.load_state_dict(state_dl.state_dict())
    assert (dropped.rows_per_rank, dropped.repeated_rows, dropped.dropped_rows) == (26, 0, 2)


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_state_saved_before_any_row_of_its_epoch_resumes_as_the_new_sizes_epoch(
        many_groups, drop_last):
    """A checkpoint at the top of the epoch loop (after set_epoch, before the first batch) at
    3 ranks, loaded at 2 ranks (and at 1): the epoch is the one a job always at the new size
    reads, rank by rank: no even-up repeat or drop of the old size (about 150 rows, which 3
    and 2 ranks split unevenly)."""
    old = PackedIterableDataset(many_groups, rank=0, world_size=3, seed=4, drop_last=drop_last)
    old.set_epoch(1)
    state = old.state_dict()
    for world in (2, 1):
        for rank in range(world):
            resumed = PackedIterableDataset(many_groups, rank=rank, world_size=world, seed=4,
                                            drop_last=drop_last)
            resumed.load_state_dict(state)
            fresh = PackedIterableDataset(many_groups, rank=rank, world_size=world, seed=4,
                                          drop_last=drop_last, epoch=1)
            assert len(resumed) == len(fresh)
            assert (resumed.repeated_rows, resumed.dropped_rows) == \
                (fresh.repeated_rows, fresh.dropped_rows)
            assert [x["index"] for x in resumed] == [x["index"] for x in fresh]


def test_len_after_a_resume_counts_the_rest_of_the_epoch(rows_120):
    """len(ds), rows_per_rank and num_batches(0) agree with what the resumed epoch yields, at
    the same size (4 of 20 batches of 3 read) as after a resize."""
    ds = PackedIterableDataset(rows_120, rank=0, world_size=2, seed=4, batch_size=3)
    it = iter(ds)
    for _ in range(4):
        next(it)
    state = ds.state_dict()
    for world in (2, 3):
        resumed = PackedIterableDataset(rows_120, rank=0, world_size=world, seed=4,
                                        batch_size=3)
        resumed.load_state_dict(state)
        counted = (len(resumed), resumed.num_batches(0), resumed.rows_per_rank)
        got = list(resumed)
        assert counted == (len(got), len(got), sum(len(b["index"]) for b in got)), world
    assert counted[0] < 20


def test_a_state_between_snapshots_resumes_in_its_loader_and_is_refused_elsewhere(rows_120):
    """A StatefulDataLoader saved 2 batches past its last snapshot (snapshot_every_n_steps=3,
    2 workers): a new StatefulDataLoader of the same size loads it and finishes the epoch
    exactly (torchdata replays the batches since the snapshot); the dataset's own
    load_state_dict, the elastic path, cannot replay them and refuses it in one line that
    names both ways, without calling it another size when it is the same one."""
    ds = PackedIterableDataset(rows_120, rank=0, world_size=1, seed=4)
    loader = stateful.StatefulDataLoader(ds, batch_size=3, collate_fn=collate, num_workers=2,
                                         snapshot_every_n_steps=3)
    before = []
    for k, b in enumerate(loader):
        before += [(s, i) for s, i in zip(b["source"], b["index"])]
        if k == 4:
            break
    state = loader.state_dict()
    assert state["_steps_since_snapshot"] == 2
    again = stateful.StatefulDataLoader(PackedIterableDataset(rows_120, rank=0, world_size=1,
                                                              seed=4),
                                        batch_size=3, collate_fn=collate, num_workers=2,
                                        snapshot_every_n_steps=3)
    again.load_state_dict(copy.deepcopy(state))
    after = [(s, i) for b in again for s, i in zip(b["source"], b["index"])]
    assert Counter(before + after) == Counter(_all_rows(rows_120))
    for world in (1, 2):
        fresh = PackedIterableDataset(rows_120, rank=0, world_size=world, seed=4)
        with pytest.raises(ValueError) as err:
            fresh.load_state_dict(copy.deepcopy(state))
        line = str(err.value)
        assert "2 batches past its last snapshot" in line, line
        assert "StatefulDataLoader.load_state_dict" in line, line
        assert "snapshot_every_n_steps=1" in line, line
        assert "\n" not in line


@pytest.fixture(scope="module")
def rows_100(tmp_path_factory):
    """100 rows (one 40-token document each at C = 64) in row groups of a few rows: a row
    count 3 ranks do not divide, so a 3-rank phase has even-up repeats."""
    from loader_helpers import pack, write_input

    d = tmp_path_factory.mktemp("rows_100")
    write_input(d / "in", [[r * 100 + p + 1 for p in range(40)] for r in range(100)])
    return pack(d / "in", d / "out", 64, "--row-group-mb", "0.002")


CHAINS = [[(2, 2, 4), (3, 1, 5), (1, 0, None)],
          [(4, 0, 3), (3, 1, 4), (2, 2, None)],
          [(3, 0, 4), (2, 0, 5), (3, 0, None)]]
KINDS = {"one output": ({}, False), "drop_last": ({"drop_last": True}, False),
         "mixture": ({"weights": {"web": 0.6, "code": 0.4}, "rows_per_epoch": 100}, True)}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("chain", CHAINS, ids=["2x2-3x1-1x0", "4x0-3x1-2x2", "3x0-2x0-3x0"])
def test_two_resizes_in_one_epoch_yield_every_row_once_plus_only_the_last_size_s_repeats(
        rows_100, web_and_code, chain, kind):
    """Two resizes in one epoch of 100 rows (3 ranks leave a remainder): the last stage yields
    exactly the epoch's rows no earlier stage yielded, each once, plus only the even-up
    repeats its own world size needs (none at one rank; an earlier 3-rank stage's repeats its
    ranks had not reached are not carried on), or with drop_last minus only its own
    remainder (an earlier stage's remainder is read); repeated_rows and dropped_rows say so."""
    kw, mixed = KINDS[kind]
    out = web_and_code if mixed else rows_100
    reference = Counter(_all_rows(out, **kw))  # the epoch: a cycled source's rows repeat
    assert sum(reference.values()) == 100
    seen, state = Counter(), None
    for world, workers, batches in chain[:-1]:
        rows, state = run_ranks(out, world, workers, batches=batches, state=state, **kw)
        assert len(rows) == world * batches * 3
        seen.update(rows)
    world, workers, _ = chain[-1]
    ds = PackedIterableDataset(out, rank=0, world_size=world, seed=4, **kw)
    ds.load_state_dict(state)
    q, repeated, dropped = ds.rows_per_rank, ds.repeated_rows, ds.dropped_rows
    last, _ = run_ranks(out, world, workers, state=state, **kw)
    last = Counter(last)
    assert sum(last.values()) == world * q
    twice = sum((seen - reference).values())  # a row and its repeat both read before a resize
    unseen = reference - seen
    rest = sum(unseen.values())
    assert rest == 100 - sum(seen.values()) + twice
    if kw.get("drop_last"):
        assert twice == 0 and not last - unseen
        assert sum((unseen - last).values()) == rest - world * q == dropped < world
        assert repeated == 0
    else:
        assert not unseen - last  # every row no rank had yielded
        extra = last - unseen  # beyond them: only this world size's even-up repeats
        assert sum(extra.values()) == world * q - rest < world
        assert set(extra) <= set(unseen)
        assert repeated == twice + world * q - rest
        assert dropped == 0


def test_the_rest_after_two_resizes_at_one_rank_is_the_rows_not_yet_seen(rows_100):
    """2 ranks x 2 workers take 10 rows each, 3 ranks x 1 worker 5 each (the 3-rank epoch
    evens up with a repeat none of them reached), then 1 rank without workers reads to the
    end: the 65 rows not yet seen, each once, and no repeated row counted."""
    def stage(world, workers, take, state):
        rows, state0 = [], None
        for rank in range(world):
            ds = PackedIterableDataset(rows_100, rank=rank, world_size=world, seed=4)
            if state is not None:
                ds.load_state_dict(state)
            dl = stateful.StatefulDataLoader(ds, batch_size=None, num_workers=workers)
            it = iter(dl)
            for k, x in enumerate(it):
                rows.append(x["index"])
                if k + 1 == take:
                    break
            if rank == 0:
                state0 = dl.state_dict()
            del it, dl
        return rows, state0, ds

    first, state, _ = stage(2, 2, 10, None)
    second, state, ds = stage(3, 1, 5, state)
    assert ds.repeated_rows == 1
    last, _, ds = stage(1, 0, None, state)
    assert ds.repeated_rows == 0 and len(last) == 65
    assert sorted(first + second + last) == list(range(100))


def test_a_state_saved_by_the_rule_before_resumes_as_it_would_have(rows_100):
    """States saved before phases recorded their rows read twice (phases of three entries):
    a phase they record is read by the rule of then (the 3-rank repeats its ranks had not
    reached come in the rest, counted), so the state resumes as it would have; a resize made
    now follows today's rule. A phase recording another count of rows read twice than its
    slots give is refused."""
    from packtool.loader.resume import normalize

    first, state = run_ranks(rows_100, 2, 2, batches=4)
    second, state = run_ranks(rows_100, 3, 1, batches=5, state=state)  # 76 rows: 2 repeats
    before = [i for _, i in first + second]
    for st in (normalize(state), _rule_1(normalize(state))):  # resized now: today's rule
        ds = PackedIterableDataset(rows_100, rank=0, world_size=1, seed=4)
        ds.load_state_dict(st)
        got = [x["index"] for x in ds]
        assert len(got) == len(set(got)) == 100 - 4 * 3 * 2 - 5 * 3 * 3
        assert ds.repeated_rows == 0
    ds = PackedIterableDataset(rows_100, rank=0, world_size=1, seed=4)
    ds.load_state_dict(state)
    it = iter(ds)
    head = [next(it)["index"] for _ in range(5)]
    saved = ds.state_dict()
    assert [len(p) for p in saved["phases"]] == [4, 4]
    for st, extra in ((saved, 0), (_rule_1(saved), 2)):
        ds = PackedIterableDataset(rows_100, rank=0, world_size=1, seed=4)
        ds.load_state_dict(st)
        got = [x["index"] for x in ds]
        assert len(got) == 31 - 5 + extra
        assert sorted(set(before + head + got)) == list(range(100))
        assert len(before + head + got) == 100 + extra == 100 + ds.repeated_rows
    _, state = run_ranks(rows_100, 3, 1, batches=2)  # 2 even-up repeats, neither reached
    bad = normalize(state)
    bad["world_size"], bad["num_workers"], bad["yielded"] = 2, 1, [1]
    bad["phases"] = [[3, 1, [6], 1]]
    ds = PackedIterableDataset(rows_100, rank=0, world_size=2, seed=4)
    with pytest.raises(ValueError, match="yielded 1 rows twice, its slots say 0"):
        ds.load_state_dict(bad)


def _rule_1(state: dict) -> dict:
    """``state`` as packtool saved it before phases recorded their rows read twice."""
    return dict(state, phases=[p[:3] for p in state["phases"]])
