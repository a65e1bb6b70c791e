"""``pack --segment-multiple N`` through the public CLI, fuzzed: random inputs, every strategy,
overflow and label mode, windows or one plan, checked row by row by an independent checker
written from the contract in docs/architectures.md (plain lists; no packtool function), and
every kept token exactly once at its recorded document and offset."""

from __future__ import annotations

import shutil
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packcheck import invoke, read_output, write_docs

IGNORE = -100


def check_padded_row(row: dict, capacity: int, n: int, pad_id: int, labels: str) -> list:
    """The padded contract of one row; returns [(start, real length)] of its documents."""
    cu, real_cu = row["cu_seqlens"], row["cu_seqlens_unpadded"]
    seg, pos, ids = row["segment_ids"], row["position_ids"], row["input_ids"]
    assert cu[0] == 0 and cu[-1] == capacity and len(real_cu) == len(cu) and real_cu[0] == 0
    spans = [b - a for a, b in zip(cu, cu[1:])]
    reals = [b - a for a, b in zip(real_cu, real_cu[1:])]
    k = len(row["doc_ids"])
    assert len(spans) in (k, k + 1), "documents, then at most the padding tail"
    assert all(s > 0 and s % n == 0 for s in spans), f"spans {spans} not multiples of {n}"
    docs = []
    targets = 0
    for q, (a, span, r) in enumerate(zip(cu, spans, reals), start=1):
        assert pos[a:a + span] == list(range(span))
        if q > k:  # the padding tail
            assert r == span and seg[a:] == [0] * span and ids[a:] == [pad_id] * span
            if labels != "none":
                assert row["labels"][a:] == [IGNORE] * span
            continue
        assert 1 <= r <= span and span == -(-r // n) * n
        assert seg[a:a + r] == [q] * r and seg[a + r:a + span] == [0] * (span - r)
        assert ids[a + r:a + span] == [pad_id] * (span - r)
        if labels == "unshifted":
            assert row["labels"][a:a + span] == [IGNORE] + ids[a + 1:a + r] + [IGNORE] * (span - r)
        elif labels == "shifted":
            assert row["labels"][a:a + span] == ids[a + 1:a + r] + [IGNORE] * (span - r + 1)
        docs.append((a, r))
        targets += r - 1
    assert row["num_targets"] == targets and row["max_seqlen"] == max(spans)
    return docs


@st.composite
def inputs(draw):
    n = draw(st.sampled_from([2, 3, 4, 8]))
    capacity = n * draw(st.integers(1, 6))
    capacity = max(capacity, 2)
    ids = st.integers(0, 9)
    lengths = st.one_of(st.just(0), st.integers(1, capacity), st.integers(capacity + 1,
                                                                             3 * capacity + 1))
    docs = [draw(st.lists(ids, min_size=m, max_size=m))
            for m in draw(st.lists(lengths, min_size=1, max_size=14))]
    if not any(docs):
        docs.append([draw(ids)])
    return dict(n=n, capacity=capacity, docs=docs, pad_id=draw(ids),
                strategy=draw(st.sampled_from(["obfd", "ordered", "concat"])),
                overflow=draw(st.sampled_from(["split", "truncate", "drop"])),
                labels=draw(st.sampled_from(["unshifted", "shifted", "none"])),
                window_docs=draw(st.one_of(st.none(), st.integers(1, 5))))


@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=inputs())
def test_padded_packs_obey_the_contract_and_conserve_tokens(tmp_path, case):
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    write_docs(work / "in" / "a.parquet", case["docs"])
    C, N = case["capacity"], case["n"]
    args = ["pack", "-q", "--capacity", C, "--segment-multiple", N, "--strategy",
            case["strategy"], "--overflow", case["overflow"], "--labels", case["labels"],
            "--pad-id", case["pad_id"], "--rows-per-shard", 3]
    if case["window_docs"]:
        args += ["--window-docs", case["window_docs"]]
    res = invoke([*args, work / "in", work / "out"])
    assert res.exit_code == 0, res.output
    rows, manifest = read_output(work / "out")
    pieces: dict = {}
    out_tokens: Counter = Counter()
    padding_inside = 0
    for row in rows:
        for (a, r), d, off in zip(check_padded_row(row, C, N, case["pad_id"], case["labels"]),
                                  row["doc_ids"], row["doc_offsets"]):
            assert row["input_ids"][a:a + r] == case["docs"][d][off:off + r]
            pieces.setdefault(d, []).append((off, r))
            out_tokens.update(row["input_ids"][a:a + r])
            padding_inside += -(-r // N) * N - r
    expected = Counter()
    for d, doc in enumerate(case["docs"]):
        if not doc or (case["overflow"] == "drop" and len(doc) > C):
            assert d not in pieces
            continue
        keep = min(len(doc), C) if case["overflow"] == "truncate" else len(doc)
        at = 0
        for off, r in sorted(pieces[d]):
            assert off == at
            at += r
        assert at == keep
        expected.update(doc[:keep])
    assert out_tokens == expected
    t = manifest.totals.to_dict()
    assert t["real_tokens"] == sum(out_tokens.values())
    assert t["segment_padding_tokens"] == padding_inside
    assert t["padding_tokens"] == len(rows) * C - t["real_tokens"]
    assert t["rows"] == len(rows) >= t["rows_without_segment_padding"]
    assert (t["rows_without_segment_padding"] > 0) == (len(rows) > 0)
    assert t["effective_targets"] == sum(r["num_targets"] for r in rows)
