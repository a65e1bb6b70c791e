"""Weighted mixtures of several packed outputs: each source's exact share per epoch over ranks
and workers, sources told apart on every item, exact resume mid-epoch, new weights between runs
without repacking, and outputs that cannot be mixed refused in one line."""

from __future__ import annotations

import shutil
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packtool.errors import ManifestError  # noqa: E402
from packtool.loader import PackedDataset, PackedIterableDataset, collate  # noqa: E402

from loader_helpers import pack, random_docs, web_and_code, write_input  # noqa: E402,F401

WEIGHTS = {"web": 0.7, "code": 0.3}


def epoch(sources, world, workers, *, epoch=0, **kw):
    """(source, index) of every row every rank yields in one epoch through a DataLoader."""
    rows = []
    for rank in range(world):
        ds = PackedIterableDataset(sources, rank=rank, world_size=world, seed=3, **kw)
        ds.set_epoch(epoch)
        dl = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate,
                                         num_workers=workers)
        rows += [(s, i) for b in dl for s, i in zip(b["source"], b["index"])]
    return rows


@pytest.mark.parametrize("world,workers", [(2, 2), (3, 0)])
def test_each_source_gives_its_exact_share_every_epoch(web_and_code, world, workers):
    """0.7 / 0.3 of 102 rows (71.4 / 30.6: weights that do not divide evenly) is 71 web rows and
    31 code rows in epochs 0 and 1, over 2 ranks x 2 workers and 3 ranks x 0 workers; every
    (source, row) of the epoch's plan exactly once."""
    probe = PackedIterableDataset(web_and_code, weights=WEIGHTS, rows_per_epoch=102, rank=0,
                                  world_size=world)
    assert probe.source_shares == {"web": 71, "code": 31} and probe.repeated_rows == 0
    n_code = probe.mixture.outputs[1].num_rows
    assert 31 > n_code  # code is cycled: more than its rows per epoch
    for e in (0, 1):
        rows = epoch(web_and_code, world, workers, epoch=e, weights=WEIGHTS,
                     rows_per_epoch=102)
        assert Counter(s for s, _ in rows) == {"web": 71, "code": 31}
        plan = PackedIterableDataset(web_and_code, weights=WEIGHTS, rows_per_epoch=102, seed=3,
                                     rank=0, world_size=1, epoch=e, shuffle_buffer=1)
        want = Counter((it["source"], it["index"]) for it in plan)
        assert Counter(rows) == want
        code = Counter(i for s, i in rows if s == "code")
        assert set(code) == set(range(n_code))  # every code row at least once ...
        assert max(code.values()) - min(code.values()) <= 2  # ... none far more than others


def test_the_cycled_source_shows_every_row_before_any_repeats(web_and_code):
    """In the epoch's order (one rank, no shuffle window), the code source's first n rows are
    its n rows, all different; the web source (larger than its share) repeats none."""
    ds = PackedIterableDataset(web_and_code, weights=WEIGHTS, rows_per_epoch=102, rank=0,
                               world_size=1, seed=3, shuffle_buffer=1)
    n_code = ds.mixture.outputs[1].num_rows
    items = list(ds)
    code = [it["index"] for it in items if it["source"] == "code"]
    assert sorted(code[:n_code]) == list(range(n_code))
    web = [it["index"] for it in items if it["source"] == "web"]
    assert len(set(web)) == len(web) == 71
    src = [it["source"] for it in items]
    longest = max(len(run) for run in "".join("w" if s == "web" else "c" for s in src).split("c"))
    assert longest <= 4  # interleaved finely: 71 / 31 is at most 3 web rows between code rows


def test_items_of_a_mixture_are_the_rows_of_their_source(web_and_code):
    """An item's source and index name the row PackedDataset of that output returns."""
    ds = PackedIterableDataset(web_and_code, weights=WEIGHTS, rows_per_epoch=40, rank=1,
                               world_size=2, seed=1)
    ref = {name: PackedDataset(path) for name, path in web_and_code.items()}
    for it in ds:
        row = ref[it["source"]][it["index"]]
        assert np.array_equal(it["input_ids"], row["input_ids"])
        assert np.array_equal(it["labels"], row["labels"])


def test_mixture_resume_mid_epoch_is_exact(web_and_code):
    """A StatefulDataLoader over a mixture (2 workers) stopped after 3 batches and restarted
    from its state yields exactly the rows an uninterrupted run yields after them."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        ds = PackedIterableDataset(web_and_code, weights=WEIGHTS, rows_per_epoch=60, rank=0,
                                   world_size=1, seed=5)
        return stateful.StatefulDataLoader(ds, batch_size=4, collate_fn=collate, num_workers=2)

    full = [(s, i) for b in make() for s, i in zip(b["source"], b["index"])]
    dl = make()
    it = iter(dl)
    before = [(s, i) for b in (next(it) for _ in range(3)) for s, i in zip(b["source"], b["index"])]
    state = dl.state_dict()
    del it, dl
    again = make()
    again.load_state_dict(state)
    after = [(s, i) for b in again for s, i in zip(b["source"], b["index"])]
    assert before + after == full


def test_new_weights_apply_from_the_next_epoch_without_repacking(web_and_code):
    """A state saved at the end of an epoch loads into a dataset with other weights (the next
    epoch has the new shares); a mid-epoch state with other weights is refused, naming it."""
    old = PackedIterableDataset(web_and_code, weights=WEIGHTS, rows_per_epoch=50, rank=0,
                                world_size=1)
    list(old)
    new = PackedIterableDataset(web_and_code, weights={"web": 1, "code": 1}, rows_per_epoch=50,
                                rank=0, world_size=1)
    new.load_state_dict(old.state_dict())
    assert new.epoch == 1
    assert Counter(it["source"] for it in new) == {"web": 25, "code": 25}
    it = iter(old)
    next(it)
    with pytest.raises(ValueError, match="mixture"):
        new.load_state_dict(old.state_dict())


def test_a_mid_epoch_refusal_names_the_sources_that_changed(web_and_code):
    """Resuming mid-epoch under other weights names each source whose rows per epoch changed,
    old -> new, in one line (it printed both whole mixture records, digests included); other
    sources and another output of a source are named the same way."""
    old = PackedIterableDataset(web_and_code, weights=WEIGHTS, rows_per_epoch=50, rank=0,
                                world_size=1)
    it = iter(old)
    next(it)
    state = old.state_dict()
    new = PackedIterableDataset(web_and_code, weights={"web": 1, "code": 1}, rows_per_epoch=50,
                                rank=0, world_size=1)
    with pytest.raises(ValueError) as exc:
        new.load_state_dict(state)
    msg = str(exc.value)
    assert "\n" not in msg and "content" not in msg and "{" not in msg, msg
    assert "the mixture: rows per epoch of sources 'web' 35 -> 25, 'code' 15 -> 25" in msg, msg
    assert "weights or rows_per_epoch" in msg
    same_web = PackedIterableDataset(web_and_code, weights={"web": 0.7, "code": 0.3},
                                     rows_per_epoch=51, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"mixture: rows per epoch of source 'web' 35 -> 36 \("):
        same_web.load_state_dict(state)
    other = PackedIterableDataset({"web": web_and_code["web"], "books": web_and_code["code"]},
                                  weights={"web": 0.7, "books": 0.3}, rows_per_epoch=50, rank=0,
                                  world_size=1)
    with pytest.raises(ValueError, match=r"sources 'web', 'code' -> 'web', 'books'") as exc:
        other.load_state_dict(state)
    assert "{" not in str(exc.value)
    swapped = PackedIterableDataset({"web": web_and_code["code"], "code": web_and_code["web"]},
                                    rows_per_epoch=50, rank=0, world_size=1)
    with pytest.raises(ValueError,
                       match=r"mixture: rows of sources 'web' \d+ -> \d+, 'code'") as exc:
        swapped.load_state_dict(state)
    assert "{" not in str(exc.value)


def test_a_state_records_the_version_of_the_epoch_order(web_and_code, tmp_path):
    """A state records the order version it was read under (states saved before carry none:
    version 1). A mid-epoch state of version 1 is refused where this packtool reads another
    order, naming the change (three sources: merged in a tree; a source whose rows per epoch
    are not a multiple of its rows: its urn's rounds kept in order); where the orders agree
    (two sources or one output, every row once an epoch) it resumes exactly; a state at the
    epoch's end loads either way."""
    from packtool.loader.plan import ORDER_VERSION

    web_in = web_and_code["web"].parent / "web_in"  # web's documents in another row order
    three = {**web_and_code, "again": pack(web_in, tmp_path / "again", 16, "--rows-per-shard",
                                           "7", "--seed", "3")}
    for sources, rows, refused in [(three, None, "three or more sources"),
                                   (web_and_code, 40, "not a multiple of its rows"),
                                   (web_and_code, None, None), (web_and_code["web"], None, None)]:
        def make():
            return PackedIterableDataset(sources, rows_per_epoch=rows, seed=2, rank=0,
                                         world_size=1)

        ds = make()
        it = iter(ds)
        head = [(x["source"], x["index"]) for x in (next(it) for _ in range(5))]
        state = ds.state_dict()
        assert state["order"] == ORDER_VERSION >= 2
        old = {k: v for k, v in state.items() if k != "order"}  # as saved before
        resumed = make()
        if refused is None:
            resumed.load_state_dict(old)
            rest = [(x["source"], x["index"]) for x in resumed]
            assert head + rest == [(x["source"], x["index"]) for x in make()]
        else:
            with pytest.raises(ValueError, match=r"epoch order \(saved under order version 1, "
                               r"this packtool reads version \d+, in which .*" + refused):
                resumed.load_state_dict(old)
        list(it)
        done = {k: v for k, v in ds.state_dict().items() if k != "order"}
        after = make()
        after.load_state_dict(done)
        assert after.epoch == 1


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("when", ["after the last batch", "after set_epoch"])
def test_new_weights_from_a_stateful_loader_checkpoint_at_the_epoch_boundary(
        web_and_code, workers, when):
    """torchdata's StatefulDataLoader checkpointed at an epoch's end, or right after
    set_epoch(next) before any row of it: the state loads with new weights and the next epoch
    is exactly an uninterrupted one at the new weights, with 0, 1 and 2 workers. With 2 workers
    each worker, loading its own finished run, refused the state before it could learn that
    the epoch had ended; with 0 workers a state taken right after set_epoch was refused as
    mid-epoch though nothing of it was read. A mid-epoch state stays refused."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make(weights):
        return PackedIterableDataset(web_and_code, weights=weights, rows_per_epoch=60, seed=3,
                                     batch_size=4, rank=0, world_size=1)

    def stream(dl):
        return [(s, i) for b in dl for s, i in zip(b["source"], b["index"])]

    new_weights = {"web": 0.5, "code": 0.5}
    old = make(WEIGHTS)
    old.set_epoch(0)
    dl = StatefulDataLoader(old, batch_size=None, num_workers=workers)
    stream(dl)
    if when == "after set_epoch":
        old.set_epoch(1)
    state = dl.state_dict()
    resumed = make(new_weights)
    dl2 = StatefulDataLoader(resumed, batch_size=None, num_workers=workers)
    dl2.load_state_dict(state)
    resumed.set_epoch(1)
    want = make(new_weights)
    want.set_epoch(1)
    assert stream(dl2) == stream(StatefulDataLoader(want, batch_size=None, num_workers=workers))
    mid = make(WEIGHTS)
    mid.set_epoch(0)
    dl = StatefulDataLoader(mid, batch_size=None, num_workers=workers)
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = dl.state_dict()
    del it
    other = make(new_weights)
    dl3 = StatefulDataLoader(other, batch_size=None, num_workers=workers)
    with pytest.raises(ValueError, match="mixture"):
        dl3.load_state_dict(state)
        other.set_epoch(0)
        stream(dl3)


@pytest.mark.parametrize("change", [dict(weights={"web": 0.1, "code": 0.9}),
                                    dict(seed=4, shuffle_buffer=3, drop_last=True)])
def test_an_untouched_stateful_loader_state_of_two_workers_loads_new_options(web_and_code,
                                                                             change):
    """A StatefulDataLoader of 2 workers checkpointed after set_epoch(1) and iter(), before any
    row of epoch 1: each worker holds only its own state (nothing yielded), which could not
    say whether its sibling had read, so worker 0 refused new weights (or seed, shuffle or
    drop_last) as mid-epoch. Now the workers agree (the shared board) that none had read, and
    epoch 1 is exactly an uninterrupted one under the new options; a state in which one worker
    had read stays refused, by every worker."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    base = dict(weights=WEIGHTS, rows_per_epoch=43, seed=3, rank=0, world_size=1)

    def loader(**kw):
        return StatefulDataLoader(PackedIterableDataset(web_and_code, **{**base, **kw}),
                                  batch_size=None, num_workers=2)

    def stream(dl):
        return [(it["source"], int(it["index"])) for it in dl]

    dl = loader()
    stream(dl)
    dl.dataset.set_epoch(1)
    it = iter(dl)
    state = dl.state_dict()
    del it
    resumed = loader(**change)
    resumed.load_state_dict(state)
    assert stream(resumed) == stream(loader(epoch=1, **change))
    dl = loader(epoch=1)
    it = iter(dl)
    next(it)  # worker 0 yielded a row, worker 1 none
    state = dl.state_dict()
    del it
    refused = loader(**change)
    refused.load_state_dict(state)
    with pytest.raises(ValueError, match="cannot resume exactly"):
        stream(refused)


def test_outputs_that_cannot_be_mixed_are_refused(web_and_code, tmp_path):
    """Another capacity, weights naming other sources, bad weights: one-line refusals."""
    wide = pack(write_input(tmp_path / "in", random_docs(20, 12)), tmp_path / "wide", 32)
    with pytest.raises(ManifestError, match=r"different capacity.*web: 16.*wide: 32"):
        PackedIterableDataset({"web": web_and_code["web"], "wide": wide}, rank=0, world_size=1)
    with pytest.raises(ValueError, match="unknown: \\['books'\\]"):
        PackedIterableDataset(web_and_code, weights={"web": 1, "code": 1, "books": 1})
    with pytest.raises(ValueError, match="weight of source 'code' is -1;"):
        PackedIterableDataset(web_and_code, weights={"web": 1, "code": -1})
    with pytest.raises(ValueError, match="weight of source 'web' is 'a';"):
        PackedIterableDataset(web_and_code, weights={"web": "a", "code": 1})
    with pytest.raises(ValueError, match="rows_per_epoch"):
        PackedIterableDataset(web_and_code, rows_per_epoch=0)
    for listed in (list(web_and_code.values()), tuple(web_and_code.values())):
        with pytest.raises(ValueError, match=r"a list of 2 outputs: give a mixture as a dict"):
            PackedIterableDataset(listed, rank=0, world_size=1)


def test_a_cycled_source_repeats_no_row_before_every_row_came(web_and_code):
    """A small source cycled over several passes, with the default shuffle window (larger than
    the epoch): in the epoch's sequence (one rank, no workers) each pass of it holds every row
    once and comes wholly before the next, so no row repeats before all were seen; over 3 ranks
    x 2 workers each row comes c // n or c // n + 1 times (the one even-up repeat aside)."""
    kw = dict(weights={"web": 1, "code": 2}, rows_per_epoch=151, seed=3)
    ds = PackedIterableDataset(web_and_code, **kw)
    n, c = int(ds.mixture.rows[1]), ds.source_shares["code"]
    base = int(ds.mixture.row_base[1])
    assert c // n >= 3 and ds.shuffle_buffer > c
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        code = [k for k in ds.rows_for().tolist() if k >= base]
        assert len(code) == c
        for p in range(0, c, n):
            part = code[p:p + n]
            assert len(set(part)) == len(part), (epoch, p)
        assert code != sorted(code)  # still shuffled
    counts = Counter()
    for rank in range(3):
        d = PackedIterableDataset(web_and_code, rank=rank, world_size=3, **kw)
        for w in range(2):
            counts.update(k for k in d.rows_for(w, 2).tolist() if k >= base)
    extra = sum(counts.values()) - c
    assert 0 <= extra <= 1 and set(counts) == set(range(base, base + n))
    assert sum(max(0, v - (c // n + 1)) for v in counts.values()) <= extra
    assert min(counts.values()) >= c // n


def test_every_row_of_a_source_once_before_any_again_over_epochs(web_and_code):
    """The default shuffle window (larger than the epoch), one rank: over 6 epochs the web
    source (40 of its 158 rows an epoch: epochs run from one round of its urn into the next)
    and the code source (160 rows an epoch of its 15: whole passes and urn draws) never give a
    row a (k + 1)-th time before every row of theirs came k times. A row of the urn's next
    round came before the last rows of the round before (web), and a pass began with the rows
    the epoch before had ended with (code)."""
    ds = PackedIterableDataset(web_and_code, weights={"web": 0.2, "code": 0.8},
                               rows_per_epoch=200, seed=11)
    assert ds.source_shares == {"web": 40, "code": 160} and ds.shuffle_buffer > 200
    sizes = dict(zip(ds.sources, (int(n) for n in ds.mixture.rows)))
    assert sizes["web"] > 40 and 160 % sizes["code"]
    counts = {name: np.zeros(n, dtype=np.int64) for name, n in sizes.items()}
    for e in range(6):
        ds.set_epoch(e)
        for it in ds:
            c = counts[it["source"]]
            i = int(it["index"])
            assert c[i] == c.min(), (e, it["source"], i, c.tolist())
            c[i] += 1


def test_flat_batches_name_their_rows_as_collate_does(web_and_code):
    """collate_flat's batches carry the rows' provenance (source, index, shard, row, doc_ids)
    as collate's do, so a per-source loss or a replay works in either form."""
    from packtool.loader import collate_flat

    ds = PackedIterableDataset(web_and_code, weights=WEIGHTS, rows_per_epoch=12, seed=2)
    items = list(ds)
    for b in range(0, len(items), 4):
        part = items[b:b + 4]
        flat, full = collate_flat(part), collate(part)
        for key in ("source", "index", "shard", "row"):
            assert flat[key] == full[key] == [it[key] for it in part]
        assert [d.tolist() for d in flat["doc_ids"]] == [it["doc_ids"].tolist() for it in part]
        assert torch.equal(flat["input_ids"].reshape(full["input_ids"].shape), full["input_ids"])


def test_a_source_of_weight_0_counts_no_rows_of_the_epoch(web_and_code):
    """weights {'web': 1, 'code': 0} by default read every web row once an epoch, as web
    alone (code's rows were counted into the epoch, so web's rows came twice); weights in the
    ratio of the sources' rows read every row of both once."""
    n = {k: len(PackedDataset(v)) for k, v in web_and_code.items()}
    ds = PackedIterableDataset(web_and_code, weights={"web": 1, "code": 0}, rank=0,
                               world_size=1)
    assert ds.source_shares == {"web": n["web"], "code": 0}
    for e in (0, 1):
        rows = epoch(web_and_code, 2, 1, epoch=e, weights={"web": 1, "code": 0})
        assert sorted(rows) == [("web", i) for i in range(n["web"])]
    both = epoch(web_and_code, 1, 0, weights={"web": 3 * n["web"], "code": 3 * n["code"]})
    assert Counter(both) == Counter([(s, i) for s in n for i in range(n[s])])


def test_one_output_under_two_names_is_refused(web_and_code, tmp_path, monkeypatch):
    """The same output twice in one mixture gave every row twice an epoch: refused in one line
    naming both sources and the fix, whether named alike, with a trailing slash, relative and
    absolute, through a link, or opened once and given twice."""
    from packtool.formats.packed import PackedOutput

    web = web_and_code["web"]
    monkeypatch.chdir(web.parent)
    (tmp_path / "link").symlink_to(web, target_is_directory=True)
    opened = PackedOutput.open(web)
    for other in (str(web), str(web) + "/", web.name, f"./{web.name}/", tmp_path / "link"):
        with pytest.raises(ValueError, match=r"^sources 'A' and 'A2' are the same output "
                                             r"\(.*\), so each of its rows would come twice an "
                                             r"epoch: give it once, under one name, and a larger "
                                             r"weight to read it more$"):
            PackedIterableDataset({"A": web, "A2": other}, rank=0, world_size=1)
    with pytest.raises(ValueError, match="^sources 'A' and 'B' are the same output"):
        PackedIterableDataset({"A": opened, "code": web_and_code["code"], "B": opened},
                              weights={"A": 1, "code": 1, "B": 1})


def test_two_copies_of_one_output_are_named_in_a_warning(web_and_code, tmp_path):
    """A copy of an output (the same shards, by sha256) under another name gave every row
    twice an epoch in silence, which the same output under two names is refused for; the copy
    may be meant, so a warning names both copies. An output of other rows gives none."""
    import warnings

    web = web_and_code["web"]
    copy = tmp_path / "web-copy"
    shutil.copytree(web, copy)
    with pytest.warns(UserWarning, match=r"^sources 'web' \(.*\) and 'again' \(.*web-copy\) "
                                         r"hold the same rows \(their \d+ shards have the "
                                         r"same sha256: copies of one output\), so each row "
                                         r"comes twice an epoch; unless that is meant"):
        PackedIterableDataset({"web": web, "again": copy}, rank=0, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PackedIterableDataset({"web": web, "code": web_and_code["code"]}, rank=0, world_size=1)
        # a copy of weight 0 gives no row: nothing comes twice
        PackedIterableDataset({"web": web, "again": copy}, weights={"web": 1, "again": 0},
                              rank=0, world_size=1)


def test_a_store_output_is_named_the_same_whatever_its_options_order():
    from packtool.location import Location

    same = ["s3://b/out?endpoint_override=h:9000&scheme=http",
            "s3://b/out/?scheme=http&endpoint_override=h:9000",
            "s3://KEY:SECRET@b/out?scheme=http&endpoint_override=h:9000&secret_key=x"]
    assert len({Location.parse(u).identity() for u in same}) == 1
    other = ["s3://b/out2?scheme=http&endpoint_override=h:9000", "s3://b/out?scheme=https",
             "gs://b/out?scheme=http&endpoint_override=h:9000"]
    assert len({Location.parse(u).identity() for u in same[:1] + other}) == 4


@pytest.fixture(scope="module")
def no_rows(tmp_path_factory):
    """An output of 0 rows (its one row left out by --min-fill)."""
    d = tmp_path_factory.mktemp("no_rows")
    return pack(write_input(d / "in", [[1, 2]]), d / "none", 16, "--min-fill", "0.5")


def test_a_source_without_rows_is_named(web_and_code, no_rows):
    """An output of 0 rows gave an empty epoch in silence, alone or as a source without
    weights: a warning names it. With a positive weight it is refused whatever the rows per
    epoch (a share rounded to 0 let it through in silence); weight 0 leaves it out."""
    import warnings

    with pytest.warns(UserWarning, match=r"^source 'none' \(.*none\) holds no rows: every "
                                         r"epoch is empty; pack rows into it$"):
        ds = PackedIterableDataset(no_rows, rank=0, world_size=1)
    assert list(ds) == []
    mix = {"web": web_and_code["web"], "none": no_rows}
    with pytest.warns(UserWarning, match=r"^source 'none' \(.*\) holds no rows: it gives none "
                                         r"to any epoch; pack rows into it, or leave it out$"):
        PackedIterableDataset(mix, rank=0, world_size=1)
    for kw in ({}, {"rows_per_epoch": 1}, {"rows_per_epoch": 50}):
        with pytest.raises(ValueError, match=r"^source 'none' \(.*\) holds no rows but has "
                                             r"weight 1; give it weight 0 or remove it$"):
            PackedIterableDataset(mix, weights={"web": 1, "none": 1}, **kw)
    with pytest.raises(ValueError, match=r"^source 'none' \(.*\) holds no rows but has weight"):
        PackedIterableDataset(no_rows, weights={"none": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = PackedIterableDataset(mix, weights={"web": 1, "none": 0}, rank=0, world_size=1)
    assert ds.source_shares == {"web": len(PackedDataset(web_and_code["web"])), "none": 0}


def _recorded(src, dst, tokenizer):
    """A copy of the packed output ``src`` at ``dst`` whose manifest records that it was packed
    from ``packtool tokenize`` outputs of ``tokenizer`` (a TokenizerInfo), its shards as they
    were."""
    import dataclasses

    from packtool.formats.manifest import (Tokenization, publish_manifest,
                                           read_manifest_and_schema)

    shutil.copytree(src, dst)
    manifest, schema = read_manifest_and_schema(dst)
    publish_manifest(dst, dataclasses.replace(manifest, tokenized=Tokenization(tokenizer, 2)),
                     schema)
    return dst


def test_outputs_of_different_tokenizers_are_named_in_a_warning(web_and_code, tmp_path):
    """Outputs whose manifests record tokenizers of another sha256 most likely hold ids that
    mean other tokens: mixing them trained one vocabulary's id as another's token, without a
    word; a warning names both sources and tokenizers (not a refusal: a tokenizer.json saved
    again has another sha256 and the same ids, as pack's own warning says). The same tokenizer
    (another file name), or an output that records none, mixes without one."""
    import warnings

    from packtool.formats.manifest import TokenizerInfo

    one = TokenizerInfo("tokenizers", "1" * 64, "tokenizer.json", 32000)
    other = TokenizerInfo("tokenizers", "2" * 64, "tokenizer.json", 32000)
    renamed = TokenizerInfo("tokenizers", "1" * 64, "copy.json", 32000)
    web = _recorded(web_and_code["web"], tmp_path / "web", one)
    code = _recorded(web_and_code["code"], tmp_path / "code", other)
    with pytest.warns(UserWarning, match=r"^outputs 'web' and 'code' hold the ids of "
                                         r"different tokenizers \(web: tokenizer\.json "
                                         r"\(tokenizers, 32,000 ids, sha256 111111111111\); "
                                         r"code: tokenizer\.json \(tokenizers, 32,000 ids, "
                                         r"sha256 222222222222\)\), so an id most likely means "
                                         r"another token in each; unless"):
        PackedIterableDataset({"web": web, "code": code}, rank=0, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = _recorded(web_and_code["code"], tmp_path / "same", renamed)
        assert PackedIterableDataset({"web": web, "code": same}, rank=0,
                                     world_size=1).source_shares
        assert PackedIterableDataset({"web": web, "plain": web_and_code["code"]}, rank=0,
                                     world_size=1).source_shares
