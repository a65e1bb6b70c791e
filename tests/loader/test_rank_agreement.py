"""Ranks of one job must split the same epoch order: two real processes (gloo, file://
rendezvous) whose datasets disagree on the seed, the epoch (set_epoch with another epoch, or on
one rank only), the mixture's weights, the loaded resume point or the ranks are refused in one
line on every rank; agreeing ones read every row once, through DataLoader workers too. The
rules themselves (tensor-parallel copies, no split) without processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from packtool.errors import LoaderError  # noqa: E402
from packtool.loader.ranks import describe_ranks, verdict  # noqa: E402

from loader_helpers import rows_120, web_and_code  # noqa: E402,F401

WORKER = textwrap.dedent("""
    import json, os, sys, time
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from packtool.errors import LoaderError
    from packtool.loader import PackedIterableDataset, collate

    rank, store, out, web, code, result = sys.argv[1:7]
    rank = int(rank)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    res = {}

    def attempt(name, make):
        try:
            make()
            res[name] = None
        except LoaderError as e:
            res[name] = str(e)

    # agreeing ranks: every row once, at epoch 0 in this process, at epoch 1 through two
    # DataLoader workers (forked once this process has read, so they start warm)
    ds = PackedIterableDataset(out, seed=7)
    res["rows0"] = [item["index"] for item in ds]
    ds.set_epoch(1)
    dl = DataLoader(ds, batch_size=4, collate_fn=collate, num_workers=2)
    res["rows1"] = [i for b in dl for i in b["index"]]
    res["ranks"] = [ds.rank, ds.world_size]
    attempt("seed", lambda: PackedIterableDataset(out, seed=rank))
    attempt("epoch", lambda: ds.set_epoch(2 + rank))
    attempt("weights", lambda: PackedIterableDataset({"web": web, "code": code},
                                                     weights={"web": 1, "code": 1 + rank}))
    attempt("same_rank", lambda: PackedIterableDataset(out, rank=0, world_size=2))
    probe = PackedIterableDataset(out, seed=1)
    it = iter(probe)
    for _ in range(3 + rank):
        next(it)
    state = probe.state_dict()
    attempt("resume", lambda: PackedIterableDataset(out, seed=1).load_state_dict(state))
    attempt("off", lambda: PackedIterableDataset(out, seed=rank, check_ranks=False))
    if rank == 0:  # built on one rank only: no collective, no wait
        attempt("one_rank_off", lambda: PackedIterableDataset(out, check_ranks=False))
    # set_epoch on rank 0 only: rank 0 waits PACKTOOL_CHECK_RANKS_TIMEOUT s, then refuses
    flag = result + ".done"
    if rank == 0:
        t = time.monotonic()
        attempt("one_rank", lambda: ds.set_epoch(5))
        res["waited"] = time.monotonic() - t
        open(flag, "w").close()
    else:
        for _ in range(600):  # stay alive until rank 0's wait is over
            if os.path.exists(flag):
                break
            time.sleep(0.05)
    with open(f"{result}.{rank}", "w") as f:
        json.dump(res, f)
    sys.stdout.flush()
    os._exit(0)  # the timed-out group cannot be shut down cleanly
""")


@pytest.fixture(scope="module")
def two_ranks(rows_120, web_and_code, tmp_path_factory):
    """Each rank's results of the scenarios above."""
    d = tmp_path_factory.mktemp("ranks")
    script, result = d / "worker.py", d / "result"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PACKTOOL_CHECK_RANKS_TIMEOUT"] = "2"
    args = [str(d / "store"), str(rows_120), str(web_and_code["web"]),
            str(web_and_code["code"]), str(result)]
    procs = [subprocess.Popen([sys.executable, str(script), str(r), *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the two ranks did not finish in 180 s")
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r}: {log[-3000:]}"
    return [json.loads((d / f"result.{r}").read_text()) for r in (0, 1)]


def test_agreeing_ranks_read_every_row_once(two_ranks, rows_120):
    from packtool.loader import PackedDataset

    n = len(PackedDataset(rows_120))
    assert [r["ranks"] for r in two_ranks] == [[0, 2], [1, 2]]
    for epoch in (0, 1):
        per_rank = [r[f"rows{epoch}"] for r in two_ranks]
        assert [len(rows) for rows in per_rank] == [n // 2] * 2
        assert Counter(i for rows in per_rank for i in rows) == Counter(range(n))
    assert two_ranks[0]["rows0"] != two_ranks[0]["rows1"]  # a new order, still split right


@pytest.mark.parametrize("case,words", [
    ("seed", ["seed", "0 on process rank 0, 1 on process rank 1", "same seed on every rank",
              "at construction"]),
    ("epoch", ["epoch", "2 on process rank 0, 3 on process rank 1", "set_epoch(e) with the same e",
               "at set_epoch"]),
    ("weights", ["sources", "code: ", "same outputs, weights and rows_per_epoch"]),
    ("same_rank", ["no process reads dataset rank 1 of world_size=2",
                   "0 on process ranks 0-1", "its own rank="]),
    ("resume", ["resume point", "rows yielded 3", "rows yielded 4", "load the same state",
                "after load_state_dict"]),
])
def test_disagreeing_ranks_are_refused_alike_on_every_rank(two_ranks, case, words):
    msgs = [r[case] for r in two_ranks]
    assert msgs[0] is not None and msgs[0] == msgs[1], msgs
    assert "\n" not in msgs[0] and "check_ranks=False" in msgs[0]
    for w in words:
        assert w in msgs[0], (w, msgs[0])


def test_set_epoch_on_one_rank_only_fails_after_the_wait(two_ranks):
    msg = two_ranks[0]["one_rank"]
    assert msg is not None and "\n" not in msg, msg
    assert "not every process of the job reached" in msg and "at set_epoch" in msg
    assert "PACKTOOL_CHECK_RANKS_TIMEOUT" in msg
    assert 1.5 < two_ranks[0]["waited"] < 60
    assert "one_rank" not in two_ranks[1]  # rank 1 never called it


def test_check_ranks_false_skips_the_collective(two_ranks):
    assert [r["off"] for r in two_ranks] == [None, None]
    assert two_ranks[0]["one_rank_off"] is None  # built on rank 0 only, no wait


def g(rank, world_size=2, **kw):
    base = {"world_size": world_size, "seed": 0, "epoch": 0, "sources": "100 of 100 rows",
            "content": "c", "order": 3, "shuffle": True, "shuffle_buffer": 1024,
            "drop_last": False, "resume": None, "dataloader_batch_size": None}
    return {**base, "rank": rank, **kw}


def test_tensor_parallel_copies_of_a_rank_pass_uneven_ones_do_not():
    assert verdict([g(0), g(0), g(1), g(1)], "at construction") is None  # 2 TP copies each
    bad = verdict([g(0), g(0), g(0), g(1)], "at construction")
    assert bad is not None and "unequal numbers of processes" in bad
    assert "0 on process ranks 0-2, 1 on process rank 3" in bad


def test_no_rank_split_of_one_stream_still_needs_one_order():
    """world_size=1 on every process over the same data (the Trainer's setup: accelerate's
    IterableDatasetShard splits the one stream each process reads whole): a per-process seed,
    epoch or dataloader_batch_size makes the streams differ, so rows come twice or never, and
    is refused; processes reading data of their own (other outputs) are free."""
    for kw in ({"seed": 1}, {"epoch": 1}, {"dataloader_batch_size": 3}, {"shuffle": False}):
        bad = verdict([g(0, 1), g(0, 1, **kw)], "at construction")
        assert bad is not None and "a Trainer's data loader then splits" in bad, kw
        assert next(iter(kw)) in bad, bad
    assert verdict([g(0, 1, seed=0), g(0, 1, seed=1, content="other")],
                   "at construction") is None
    assert verdict([g(0, 1), g(0, 1)], "at construction") is None
    bad = verdict([g(0, 1), g(1, 2)], "at construction")
    assert bad is not None and "world_size" in bad


def test_ranks_of_another_dataloader_batch_size_are_refused():
    """Ranks whose dataloader_batch_size differs yield different numbers of batches (one rank
    steps once more, its collective waits for ever): refused like a seed."""
    bad = verdict([g(0), g(1, dataloader_batch_size=4)], "at construction")
    assert bad is not None and "dataloader_batch_size: None on process rank 0, 4 on " in bad


def test_world_size_without_rank_is_rank_0_of_1_or_refused(monkeypatch, rows_120):
    """world_size=1 alone under torchrun is rank 0 of it (it was torch's rank: 'need 0 <= rank
    < world_size, got rank=1'); another world_size than torch's without rank= is refused."""
    from packtool.loader import PackedIterableDataset

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = PackedIterableDataset(rows_120, world_size=1)
    assert (ds.rank, ds.world_size) == (0, 1)
    with pytest.raises(ValueError, match="world_size=3 without rank=: .* pass rank= too"):
        PackedIterableDataset(rows_120, world_size=3)


def test_describe_ranks_groups_and_caps():
    assert describe_ranks([5, 5, 5, 6, 5]) == "5 on process ranks 0-2, 4, 6 on process rank 3"
    assert describe_ranks(list(range(7)), limit=2).endswith("5 more values")
    assert issubclass(LoaderError, Exception)
