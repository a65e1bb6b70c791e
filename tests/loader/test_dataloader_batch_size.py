"""Rows a DataLoader batches in K workers: with ``dataloader_batch_size=B`` each worker gets a
whole number of B-row batches, so the DataLoader yields exactly ``len(DataLoader)`` batches and
every row (a loop sized by that length, the Hugging Face Trainer's, trains them all), resume
stays exact; without it a worker warns once that rows would be left out."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from packtool.loader import PackedIterableDataset, collate  # noqa: E402
from packtool.loader.plan import worker_bounds  # noqa: E402

from loader_helpers import (pack, rows_120, stop_and_resume, web_and_code,  # noqa: E402,F401
                            write_input)
import loader_helpers  # noqa: E402


def indices(batches) -> list:
    return [i for b in batches for i in b["index"]]


@pytest.mark.parametrize("q", [0, 1, 7, 8, 23, 24, 25])
@pytest.mark.parametrize("K", [1, 2, 3, 5])
@pytest.mark.parametrize("B", [1, 3, 8])
def test_worker_runs_are_whole_batches_but_the_last(q, K, B):
    """The runs tile 0 .. q in order, each a multiple of B rows but the one ending at q, and
    their batches add up to ceil(q / B)."""
    runs = [worker_bounds(q, w, K, B) for w in range(K)]
    assert runs[0][0] == 0 and runs[-1][1] == q
    assert all(b == a2 for (_, b), (a2, _) in zip(runs, runs[1:]))
    assert all((b - a) % B == 0 for a, b in runs if b != q)
    assert sum(-(-(b - a) // B) for a, b in runs) == -(-q // B)


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_dataloader_yields_exactly_its_length_and_every_row(rows_120, num_workers, drop_last):
    """1 rank of 120 rows (and rank 1 of 2) in batches of 8 by a DataLoader with 0 .. 4
    workers: exactly len(DataLoader) batches (ceil, or floor with the DataLoader's drop_last),
    each row once (drop_last: all but the rank's last q % B rows), num_batches(K) says the
    same; the order is the same on a second pass."""
    for rank, world in ((0, 1), (1, 2)):
        ds = PackedIterableDataset(rows_120, rank=rank, world_size=world, seed=3,
                                   shuffle_buffer=16, dataloader_batch_size=7)
        dl = DataLoader(ds, batch_size=7, collate_fn=collate, num_workers=num_workers,
                        drop_last=drop_last)
        batches = list(dl)
        q = len(ds)
        assert len(batches) == len(dl) == (q // 7 if drop_last else -(-q // 7))
        assert ds.num_batches(num_workers) == -(-q // 7)
        assert all(len(b["index"]) == 7 for b in batches[:-1])  # only the last one short
        got = indices(batches)
        one = [x["index"] for x in PackedIterableDataset(rows_120, rank=rank, world_size=world,
                                                         seed=3, shuffle_buffer=16)]
        assert len(got) == len(set(got)) == (q - q % 7 if drop_last else q)
        assert set(got) <= set(one)
        if world == 1:
            assert sorted(got) == (sorted(got) if drop_last else list(range(120)))
        assert indices(dl) == got


def test_a_mixture_of_two_outputs_too(web_and_code):
    """A weighted mixture, 3 workers, batches of 5: len(DataLoader) batches, every row of the
    rank's share once (the same multiset as without workers)."""
    def make(**kw):
        return PackedIterableDataset(web_and_code, weights={"web": 3, "code": 1},
                                     rows_per_epoch=101, seed=2, rank=0, world_size=2, **kw)
    ds = make(dataloader_batch_size=5)
    dl = DataLoader(ds, batch_size=5, collate_fn=collate, num_workers=3)
    batches = list(dl)
    assert len(batches) == len(dl) == ds.num_batches(3) == -(-len(ds) // 5)
    keys = [(s, i) for b in batches for s, i in zip(b["source"], b["index"])]
    alone = [(x["source"], x["index"]) for x in make()]
    assert Counter(keys) == Counter(alone)


_WARN_SCRIPT = """
import sys
from torch.utils.data import DataLoader
from packtool.loader import PackedIterableDataset, collate
out, kw, dl_kw = sys.argv[1], eval(sys.argv[2]), eval(sys.argv[3])
ds = PackedIterableDataset(out, seed=3, **kw)
dl = DataLoader(ds, collate_fn=collate if dl_kw.get("batch_size", 1) else None, **dl_kw)
counts = []
for epoch in range(2):
    ds.set_epoch(epoch)
    counts.append(len(list(dl)))
print(counts, len(dl), ds.num_batches(dl_kw["num_workers"]))
"""


def run_loader(out, kw: dict, dl_kw: dict) -> tuple[str, str]:
    """(stdout, stderr) of two epochs of a DataLoader over the dataset in a fresh process (a
    worker's warning goes to the process's stderr)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONWARNINGS="default")
    res = subprocess.run([sys.executable, "-c", _WARN_SCRIPT, str(out), repr(kw), repr(dl_kw)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip(), res.stderr


def test_without_it_several_workers_yield_more_batches_and_warn_once(rows_120):
    """The loss it prevents: 120 rows, batches of 8, 4 workers (30 rows each) yield 16 batches
    for a length of 15; a worker warns once per dataset (not again the next epoch), in one line
    naming the keyword; none with it, with one worker, or when the DataLoader does not batch."""
    out, err = run_loader(rows_120, {}, {"batch_size": 8, "num_workers": 4})
    assert out == "[16, 16] 15 120"
    lines = [x for x in err.splitlines() if "dataloader_batch_size=" in x]
    assert len(lines) == 1, err
    assert "with 4 DataLoader workers" in lines[0] and "yields 1 batch more than" in lines[0]
    # the flag the warning sets in the box the training process shares with its workers
    from packtool.loader.distributed import _WARNED

    quiet = [(PackedIterableDataset(rows_120, seed=3, dataloader_batch_size=8),
              {"batch_size": 8, "collate_fn": collate, "num_workers": 4}),
             (PackedIterableDataset(rows_120, seed=3), {"batch_size": None, "num_workers": 2}),
             (PackedIterableDataset(rows_120, seed=3),
              {"batch_size": 8, "collate_fn": collate, "num_workers": 1}),
             (PackedIterableDataset(rows_120, seed=3),
              {"batch_size": 8, "collate_fn": collate, "num_workers": 2})]
    quiet += [(PackedIterableDataset(rows_120, seed=3),  # batches of 1: never one more
               {"batch_size": 1, "collate_fn": collate, "num_workers": 2}),
              (PackedIterableDataset(rows_120, seed=3),  # runs of 60 rows: whole batches of 6
               {"batch_size": 6, "collate_fn": collate, "num_workers": 2})]
    for i, (ds, dl_kw) in enumerate(quiet):
        dl = DataLoader(ds, **dl_kw)
        got = len(list(dl))
        assert int(ds._epoch_box[_WARNED]) == (i == 3), dl_kw
        if dl_kw["batch_size"]:
            assert got == len(dl) + (i == 3), dl_kw  # a warning exactly where one more came


@pytest.mark.parametrize("B,K,batches,read", [(27, 2, 0, 0), (5, 3, 3, 15), (5, 2, 4, 20)])
def test_drop_last_in_several_workers_warns_of_the_rows_left_unread(tmp_path, B, K, batches,
                                                                    read):
    """27 rows, DataLoader(drop_last=True) batching them in K workers: each worker drops its
    own partial batch, so fewer batches than len(DataLoader) come and up to K * (B - 1) rows
    go unread (B = 27, K = 2: an empty epoch). The warning said "1 batch more than
    len(DataLoader)" (B = 27) or nothing; it now says how many batches fewer and how many rows
    unread; with dataloader_batch_size=B every batch of len(DataLoader) comes, no warning."""
    src = write_input(tmp_path / "in", [list(range(1, 9))] * 27)
    out = pack(src, tmp_path / "out", 8)  # 27 rows of one document each
    from packtool.loader.distributed import _WARNED

    ds = PackedIterableDataset(out, seed=3)
    assert len(ds) == 27
    dl = DataLoader(ds, batch_size=B, num_workers=K, collate_fn=collate, drop_last=True)
    got = list(dl)
    assert (len(got), len(indices(got))) == (batches, read) and int(ds._epoch_box[_WARNED])
    fewer = len(dl) - batches
    _, err = run_loader(out, {}, {"batch_size": B, "num_workers": K, "drop_last": True})
    said = [x for x in err.splitlines() if "dataloader_batch_size=" in x]
    assert len(said) == 1 and "more than len(DataLoader)" not in said[0], err
    assert (f"yields {fewer} batch{'es' if fewer != 1 else ''} fewer than len(DataLoader) and "
            f"leaves {27 - read} of this rank's 27 rows unread this epoch ({27 % B} without "
            "workers)") in said[0], said[0]
    whole = PackedIterableDataset(out, seed=3, dataloader_batch_size=B)
    dl = DataLoader(whole, batch_size=B, num_workers=K, collate_fn=collate, drop_last=True)
    got = list(dl)
    assert len(got) == len(dl) and len(indices(got)) == B * len(dl)
    assert not int(whole._epoch_box[_WARNED])


@pytest.mark.parametrize("bad", [0, -2, True, 2.0, "8"])
def test_bad_values_are_refused(rows_120, bad):
    with pytest.raises(ValueError, match="dataloader_batch_size must be a positive integer"):
        PackedIterableDataset(rows_120, dataloader_batch_size=bad)


def test_it_and_batch_size_together_are_refused(rows_120):
    with pytest.raises(ValueError, match="give one of them"):
        PackedIterableDataset(rows_120, batch_size=4, dataloader_batch_size=4)


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_resume_mid_epoch_is_exact(rows_120, num_workers):
    """StatefulDataLoader, batches of 7: stopped after k batches and restarted from its state,
    the rest is exactly the batches an uninterrupted run yields after them; the dataset loaded
    with that state counts the remaining batches."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make(ds=None):
        ds = ds or PackedIterableDataset(rows_120, rank=1, world_size=2, seed=4,
                                         shuffle_buffer=8, dataloader_batch_size=7)
        ds.set_epoch(1)
        return stateful.StatefulDataLoader(ds, batch_size=7, collate_fn=collate,
                                           num_workers=num_workers)

    full = list(make())
    assert len(full) == -(-60 // 7)
    for k in (1, 3, len(full) - 1):
        _, head, rest, state = stop_and_resume(make, k, full)
        assert indices(head) + indices(rest) == indices(full), k
        fresh = PackedIterableDataset(rows_120, rank=1, world_size=2, seed=4, shuffle_buffer=8,
                                      dataloader_batch_size=7)
        fresh.load_state_dict(state)
        assert fresh.num_batches(num_workers) == len(full) - k


def test_elastic_resume_to_other_workers_and_batch_size(rows_120):
    """Stopped after 3 batches of 7 in 2 workers, resumed at 3 workers and batches of 5
    (dataloader_batch_size too): every row of the epoch once, the rest in exactly
    len(DataLoader) batches; a state saved in the rest says the old phase's batch size."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    ds = PackedIterableDataset(rows_120, seed=4, dataloader_batch_size=7)
    dl = stateful.StatefulDataLoader(ds, batch_size=7, collate_fn=collate, num_workers=2)
    it = iter(dl)
    head = [next(it) for _ in range(3)]
    state = dl.state_dict()
    del it, dl
    new = PackedIterableDataset(rows_120, seed=4, dataloader_batch_size=5)
    new.load_state_dict(state)
    dl = DataLoader(new, batch_size=5, collate_fn=collate, num_workers=3)
    rest = list(dl)
    assert len(rest) == len(dl) == -(-(120 - 21) // 5) == new.num_batches(3)
    assert sorted(indices(head) + indices(rest)) == list(range(120))
    again = PackedIterableDataset(rows_120, seed=4, dataloader_batch_size=5)
    again.load_state_dict(state)
    it = iter(again)
    next(it)
    saved = again.state_dict()
    assert saved["phases"][0][0:2] == [1, 2] and saved["phases"][0][-1] == 7
    assert saved["dataloader_batch_size"] == 5


def test_a_state_without_the_keyword_still_resumes(rows_120):
    """A state saved without the field (before it was recorded) resumes as runs of rows."""
    ds = PackedIterableDataset(rows_120, seed=4)
    it = iter(ds)
    head = [next(it)["index"] for _ in range(10)]
    state = ds.state_dict()
    del state["dataloader_batch_size"]
    again = PackedIterableDataset(rows_120, seed=4)
    again.load_state_dict(state)
    assert head + [x["index"] for x in again] == [x["index"] for x in
                                                 PackedIterableDataset(rows_120, seed=4)]


@pytest.fixture(scope="module")
def eight_rows(tmp_path_factory):
    """8 rows of one full-length document each, each row's tokens its own (vocab 64)."""
    d = tmp_path_factory.mktemp("eight")
    write_input(d / "in", [[r + 1] * 16 for r in range(8)])
    return pack(d / "in", d / "out", 16, "--rows-per-shard", "3")


def test_the_trainer_trains_every_row_every_epoch(eight_rows, tmp_path):
    """Trainer, per_device_train_batch_size=3, dataloader_num_workers=2, 2 epochs over 8 rows:
    with dataloader_batch_size=3 every row is trained once per epoch (without it 2 workers of 4
    rows yield 4 batches for a length of 3, and the Trainer stops after 3)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from packtool.loader import HFCollator

    seen = Counter()

    class Counting(transformers.Trainer):
        def compute_loss(self, model, inputs, **kw):
            seen.update(int(r[0]) for r in inputs["input_ids"].tolist())
            return super().compute_loss(model, inputs, **kw)

    ds = PackedIterableDataset(eight_rows, seed=0, dataloader_batch_size=3)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"), num_train_epochs=2, per_device_train_batch_size=3,
        dataloader_num_workers=2, accelerator_config={"dispatch_batches": False},
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = Counting(model=loader_helpers.tiny_llama(64), args=args, train_dataset=ds,
                          data_collator=HFCollator()).train()
    assert result.global_step == 2 * 3
    assert seen == Counter({r + 1: 2 for r in range(8)})
    assert np.isfinite(result.training_loss)
