"""Fuzzing through the public CLI: random small Parquet inputs (lengths including 0 and > C,
odd capacities, pad/eos ids that collide with real ids, every strategy, overflow mode and label
convention), checked by the independent checker in ``packcheck`` (contract of every row, every
kept token exactly once at its recorded document and offset) and against the manifest totals."""

from __future__ import annotations

import shutil
from collections import Counter

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packcheck import check_output, invoke, read_output, write_docs

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint16(), pa.uint32(),
             pa.uint64()]


@st.composite
def inputs(draw):
    capacity = draw(st.integers(2, 13))
    ids = st.integers(0, 9)  # a small vocabulary: pad and eos ids collide with real ids
    lengths = st.one_of(st.just(0), st.integers(1, capacity), st.integers(capacity + 1,
                                                                             3 * capacity + 1))
    n_files = draw(st.integers(1, 3))
    files = [draw(st.lists(lengths, max_size=8)) for _ in range(n_files)]
    files = [[draw(st.lists(ids, min_size=n, max_size=n)) for n in f] for f in files]
    if not any(t for f in files for t in f):
        files[0].append([draw(ids)])
    return dict(
        capacity=capacity, files=files,
        value_type=draw(st.sampled_from(INT_TYPES)),
        strategy=draw(st.sampled_from(["obfd", "ordered", "concat"])),
        overflow=draw(st.sampled_from(["split", "truncate", "drop"])),
        labels=draw(st.sampled_from(["unshifted", "shifted", "none"])),
        pad_id=draw(ids),
        append_eos=draw(st.one_of(st.none(), ids)),
        rows_per_shard=draw(st.integers(1, 4)),
        shuffle=draw(st.booleans()),
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=inputs())
def test_fuzz_pack_obeys_the_contract_and_conserves_tokens(tmp_path, case):
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    for i, docs in enumerate(case["files"]):
        write_docs(work / "in" / f"{i:02d}.parquet", docs, case["value_type"])
    args = ["pack", "-q", "--capacity", case["capacity"], "--strategy", case["strategy"],
            "--overflow", case["overflow"], "--labels", case["labels"], "--pad-id",
            case["pad_id"], "--rows-per-shard", case["rows_per_shard"]]
    if case["append_eos"] is not None:
        args += ["--append-eos", case["append_eos"]]
    if not case["shuffle"]:
        args.append("--no-shuffle")
    res = invoke([*args, work / "in", work / "out"])
    assert res.exit_code == 0, res.output
    rows, manifest = read_output(work / "out")

    docs = [d for f in case["files"] for d in f]  # global document index: file order, row order
    eos = case["append_eos"]
    full = [d + [eos] if eos is not None and d and d[-1] != eos else d for d in docs]
    capacity = case["capacity"]
    out_tokens = check_output(rows, docs, capacity, pad_id=case["pad_id"],
                              labels=case["labels"], overflow=case["overflow"], append_eos=eos)

    expected = Counter()
    for d in full:
        if case["overflow"] == "drop" and len(d) > capacity:
            continue
        expected.update(d[:capacity] if case["overflow"] == "truncate" else d)
    assert out_tokens == expected

    t = manifest.totals.to_dict()
    assert t["docs_in"] == len(docs)
    assert t["docs_empty"] == sum(1 for d in docs if not d)
    assert t["tokens_in"] == sum(map(len, full))
    assert t["rows"] == len(rows)
    assert sum(e.rows for e in manifest.shards) == len(rows)
    assert all(e.rows <= case["rows_per_shard"] for e in manifest.shards)
    assert t["real_tokens"] == sum(out_tokens.values())
    assert t["tokens_in"] == t["real_tokens"] + t["tokens_dropped"]  # every token not written
    assert t["padding_tokens"] == len(rows) * capacity - t["real_tokens"]
    assert t["effective_targets"] == sum(r["num_targets"] for r in rows)
    assert t["segments"] == sum(len(r["doc_ids"]) for r in rows)
    if case["strategy"] == "concat":  # one stream cut every C tokens: only the last row pads
        assert t["rows"] == -(-t["real_tokens"] // capacity)
