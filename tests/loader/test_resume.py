"""Exact resume: a job stopped mid-epoch and restarted from its last state_dict yields exactly
the rows it had not yet yielded, with torchdata's StatefulDataLoader, 0 and 2 workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

from packtool.loader import PackedIterableDataset, collate  # noqa: E402

from loader_helpers import many_groups, stop_and_resume  # noqa: E402,F401


def make_loader(out, num_workers, epoch=1):
    ds = PackedIterableDataset(out, rank=1, world_size=2, seed=4, shuffle_buffer=8)
    ds.set_epoch(epoch)
    return stateful.StatefulDataLoader(ds, batch_size=4, collate_fn=collate,
                                       num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_at_several_points_yields_exactly_the_remaining_rows(many_groups, num_workers):
    """Stop after k batches (k = 1, middle, last but one), restart a new loader from the
    state: the rows after the restart are exactly the epoch's rows not yet yielded, in the
    order an uninterrupted run yields them."""
    full = [i for b in make_loader(many_groups, num_workers) for i in b["index"]]
    n_batches = -(-len(full) // 4) + num_workers  # upper bound: a partial batch per worker
    for k in (1, len(full) // 8, len(full) // 4 - 1):
        loader = make_loader(many_groups, num_workers)
        before, it = [], iter(loader)
        for _ in range(k):
            before += next(it)["index"]
        state = loader.state_dict()
        del it, loader  # the job dies here
        resumed = make_loader(many_groups, num_workers, epoch=0)  # epoch comes from the state
        resumed.load_state_dict(state)
        after = [i for b in resumed for i in b["index"]]
        assert Counter(before) + Counter(after) == Counter(full), k
        assert before + after == full, k
        assert k < n_batches


def test_one_workers_state_cannot_resize_the_job(many_groups):
    """One worker's state (of a loader with 2) says nothing of its sibling's progress: loading
    it at another world size is refused when iteration starts, naming the whole-state fix; a
    state of another seed is refused in mid-epoch."""
    ds = PackedIterableDataset(many_groups, rank=0, world_size=2)
    state = ds.state_dict()
    state.update(num_workers=2, worker=1, yielded=3)
    other = PackedIterableDataset(many_groups, rank=0, world_size=3)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match=r"worker 1's of 2.*ds.load_state_dict\(loader_state\)"):
        iter(other)
    reseeded = PackedIterableDataset(many_groups, rank=0, world_size=2, seed=9)
    with pytest.raises(ValueError, match="seed"):
        reseeded.load_state_dict(ds.state_dict() | {"yielded": 2})


def test_state_dict_without_workers_counts_rows_yielded(many_groups):
    """The dataset's own state (no torchdata): rows yielded so far in the epoch."""
    ds = PackedIterableDataset(many_groups, rank=0, world_size=1, seed=3)
    it = iter(ds)
    first = [next(it)["index"] for _ in range(10)]
    state = ds.state_dict()
    assert state["yielded"] == 10 and state["epoch"] == 0
    again = PackedIterableDataset(many_groups, rank=0, world_size=1, seed=3)
    again.load_state_dict(state)
    rest = [x["index"] for x in again]
    assert first + rest == [x["index"] for x in PackedIterableDataset(many_groups, rank=0,
                                                                      world_size=1, seed=3)]


KILLED_JOB = textwrap.dedent("""
    import json, os, signal, sys
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    from packtool.loader import PackedIterableDataset, collate

    out, ckpt, log, kill_after = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ds = PackedIterableDataset(out, rank=0, world_size=1, seed=11, shuffle_buffer=16)
    loader = StatefulDataLoader(ds, batch_size=5, collate_fn=collate, num_workers=2)
    if os.path.exists(ckpt):
        loader.load_state_dict(torch.load(ckpt))
    for step, batch in enumerate(loader):
        with open(log, "a") as f:          # the 'training step' on this batch
            f.write(json.dumps(batch["index"]) + "\\n")
        torch.save(loader.state_dict(), ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)    # checkpoint after the step
        if step + 1 == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
""")


def test_sigkilled_job_resumed_from_its_checkpoint_trains_each_row_once(many_groups, tmp_path):
    """A real process with 2 workers is SIGKILLed twice mid-epoch; each restart loads the last
    checkpoint; over the three runs every row of the epoch is trained exactly once."""
    script = tmp_path / "job.py"
    script.write_text(KILLED_JOB)
    ckpt, log = tmp_path / "ckpt.pt", tmp_path / "steps.jsonl"
    for kill_after in (3, 4, 10**6):
        res = subprocess.run([sys.executable, str(script), str(many_groups), str(ckpt),
                              str(log), str(kill_after)], capture_output=True, text=True,
                             timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert res.returncode == (-9 if kill_after < 10**6 else 0), res.stderr[-2000:]
    trained = [i for line in log.read_text().splitlines() for i in json.loads(line)]
    n = PackedIterableDataset(many_groups, rank=0, world_size=1).output.num_rows
    assert sorted(trained) == list(range(n))


def test_whole_batches_from_workers_resume_exactly(many_groups):
    """batch_size on the dataset, 2 workers (batches cross as gathered rows and are collated on
    arrival): a StatefulDataLoader restarted from its state yields exactly the batches an
    uninterrupted run yields after the stop, collated the same."""
    def make():
        ds = PackedIterableDataset(many_groups, rank=0, world_size=1, seed=2, batch_size=6)
        return stateful.StatefulDataLoader(ds, batch_size=None, num_workers=2)

    full, before, after, _ = stop_and_resume(make, 5)
    assert all(b["input_ids"].dtype == torch.int32 for b in full)
    assert len(before) + len(after) == len(full)
    for a, b in zip(before + after, full):
        assert a["index"] == b["index"] and torch.equal(a["labels"], b["labels"])
        assert torch.equal(a["position_ids"], b["position_ids"])


@pytest.mark.parametrize("field, value", [
    ("yielded", -5), ("yielded", 10**9), ("yielded", True), ("yielded", [1, 2]),
    ("world_size", 0), ("num_workers", 0), ("rank", 3), ("worker", 5), ("epoch", -1),
    ("epoch", 1.5), ("seed", "x"), ("shuffle", 1), ("drop_last", None), ("shuffle_buffer", 0),
    ("mixture", {}), ("phases", [[0, 1, [0]]]), ("phases", [[2, 1, [10**6]]]),
])
def test_a_malformed_state_is_refused_in_one_line(many_groups, field, value):
    """Every field of a loaded state is checked (type, range, and rows yielded that fit the
    runs): a bad one is one ValueError naming it, never a silent skip, a finished epoch or a
    ZeroDivisionError."""
    ds = PackedIterableDataset(many_groups, rank=0, world_size=1)
    good = ds.state_dict()
    with pytest.raises(ValueError, match="malformed state") as err:
        ds.load_state_dict({**good, field: value})
    assert "\n" not in str(err.value)
    ds.load_state_dict(good)
    assert len(list(ds)) == ds.rows_per_rank


def test_a_mid_epoch_state_of_other_rows_under_the_same_name_is_refused(tmp_path):
    """The same documents repacked with another seed into a folder of the same name: the same
    source name and row count, other rows. A mid-epoch state of one does not load into the other
    (it would repeat some pieces and skip others); a copy of the same output does, and an
    end-of-epoch state loads into either."""
    import shutil

    from loader_helpers import pack, random_docs, write_input

    write_input(tmp_path / "in", random_docs(80, 12, seed=2))
    a = pack(tmp_path / "in", tmp_path / "a" / "out", 16, "--seed", "1")
    b = pack(tmp_path / "in", tmp_path / "b" / "out", 16, "--seed", "7")
    shutil.copytree(a, tmp_path / "c" / "out")
    ds = PackedIterableDataset(a, seed=0)
    it = iter(ds)
    for _ in range(10):
        next(it)
    st = ds.state_dict()
    other = PackedIterableDataset(b, seed=0)
    assert len(other) == len(ds)
    with pytest.raises(ValueError, match=r"the rows of source 'out' \(the same name and row"):
        other.load_state_dict(st)
    copy = PackedIterableDataset(tmp_path / "c" / "out", seed=0)
    copy.load_state_dict(st)
    rest = [x["index"] for x in copy]
    assert sorted([x["index"] for x in PackedIterableDataset(a, seed=0)][:10] + rest) == \
        list(range(len(ds)))
    legacy = dict(st, mixture={"sources": st["mixture"]["sources"]})  # saved before digests
    PackedIterableDataset(b, seed=0).load_state_dict(legacy)
