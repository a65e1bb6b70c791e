"""Faults reported in public packing tools' trackers (case ids B01..B34), each rewritten as a tiny
``pack`` input with its exact expected values, run through the public CLI (``--no-shuffle``) and
read back with pyarrow.

Each kind of fault a case exposes also gets a property test over random inputs (hypothesis):
positions restart at every segment, no label crosses a segment, cu_seqlens is strictly
increasing and ends at C, padding only at the tail, and no token is lost or duplicated.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packcheck import IGNORE, check_output, invoke, pack_docs, segments_of, write_docs
from packtool.core.packing import pack_lengths

AB = [[11, 12, 13], [21, 22]]


def test_B01_position_ids_restart_at_each_document(tmp_path):
    """B01: the second document starts at position 0, not 3 (RoPE must not see a continuation)."""
    rows, _ = pack_docs(tmp_path, AB, 6)
    assert len(rows) == 1
    assert rows[0]["position_ids"] == [0, 1, 2, 0, 1, 0]
    assert rows[0]["segment_ids"] == [1, 1, 1, 2, 2, 0]
    seg, pos = rows[0]["segment_ids"], rows[0]["position_ids"]
    assert all(pos[j] == 0 for j in range(1, 6) if seg[j] != seg[j - 1])


def test_B03_no_target_from_the_previous_document(tmp_path):
    """B03: the first token of each document carries -100, never a cross-document target."""
    rows, manifest = pack_docs(tmp_path, AB, 6)
    assert rows[0]["labels"] == [-100, 12, 13, -100, 22, -100]
    assert rows[0]["num_targets"] == 3
    assert manifest.totals.effective_targets == 3
    seg, lab = rows[0]["segment_ids"], rows[0]["labels"]
    assert all(lab[j] == IGNORE for j in range(1, 6) if seg[j] != seg[j - 1])


def test_B03_B04_shifted_labels_are_shifted_per_document(tmp_path):
    """B03/B04: shifted labels shift inside each document; position 2 is -100, not 21."""
    rows, manifest = pack_docs(tmp_path, AB, 6, "--labels", "shifted")
    assert rows[0]["labels"] == [12, 13, -100, 22, -100, -100]
    assert rows[0]["labels"][2] == -100
    assert rows[0]["num_targets"] == 3
    assert manifest.totals.effective_targets == 3


@pytest.mark.parametrize("mode,expected", [("unshifted", [-100, 12, 13, 14]),
                                           ("shifted", [12, 13, 14, -100])])
def test_B05_labels_shifted_once_and_convention_recorded(tmp_path, mode, expected):
    """B05: labels are shifted at most once, and the shard and manifest say which convention."""
    rows, manifest = pack_docs(tmp_path, [[11, 12, 13, 14]], 4, "--labels", mode)
    assert rows[0]["labels"] == expected
    assert rows[0]["labels"] != [13, 14, -100, -100]  # the doubly shifted answer
    assert rows[0]["num_targets"] == 3
    meta = pq.read_schema(tmp_path / "out" / "part-00000.parquet").metadata
    assert meta[b"packtool.labels_convention"] == mode.encode()
    assert manifest.labels.stored and manifest.labels.convention == mode
    ids, lab = rows[0]["input_ids"], rows[0]["labels"]
    unshifted = all(lab[j] in (ids[j], IGNORE) for j in range(4))
    shifted = all(lab[j] in (ids[j + 1] if j + 1 < 4 else None, IGNORE) for j in range(4))
    assert unshifted != shifted  # exactly one invariant holds
    assert shifted is (mode == "shifted")


def test_B06_cu_seqlens_stored_as_list_int32(tmp_path):
    """B06 (pack side): cu_seqlens is list<int32>, the only dtype the varlen kernels take."""
    rows, _ = pack_docs(tmp_path, AB, 6)
    assert rows[0]["cu_seqlens"] == [0, 3, 5, 6]
    schema = pq.read_schema(tmp_path / "out" / "part-00000.parquet")
    assert schema.field("cu_seqlens").type.value_type == pa.int32()


def test_B07a_cu_seqlens_covers_the_padding(tmp_path):
    """B07(a): cu_seqlens ends at C, the padding tail is one more segment."""
    rows, _ = pack_docs(tmp_path, AB, 8)
    assert rows[0]["cu_seqlens"] == [0, 3, 5, 8]
    assert rows[0]["cu_seqlens"][-1] == 8 == len(rows[0]["input_ids"])


def test_B07b_full_row_has_no_zero_length_padding_segment(tmp_path):
    """B07(b): a row filled exactly has no trailing duplicate C."""
    rows, _ = pack_docs(tmp_path, [[4, 5, 6, 7, 8], [1, 2, 3]], 8)
    assert len(rows) == 1
    assert rows[0]["cu_seqlens"] == [0, 5, 8]
    assert rows[0]["input_ids"] == [4, 5, 6, 7, 8, 1, 2, 3]
    assert rows[0]["max_seqlen"] == 5


def test_B08_empty_documents_are_skipped_and_counted(tmp_path):
    """B08: an empty document never becomes a zero-length segment; it is skipped and counted."""
    rows, manifest = pack_docs(tmp_path, [[8, 9], [7], []], 4)
    assert len(rows) == 1
    row = rows[0]
    assert row["input_ids"] == [8, 9, 7, 0]
    assert row["cu_seqlens"] == [0, 2, 3, 4]
    assert row["labels"] == [-100, 9, -100, -100]
    assert row["num_targets"] == 1
    assert row["doc_ids"] == [0, 1]
    t = manifest.totals.to_dict()
    assert (t["docs_in"], t["docs_empty"], t["effective_targets"]) == (3, 1, 1)
    cu = row["cu_seqlens"]
    assert all(a < b for a, b in zip(cu, cu[1:]))


def test_B10_overflow_of_long_documents_is_repacked_not_lost(tmp_path):
    """B10: the chunk past C is packed again as its own segment; no token vanishes."""
    docs = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]]
    rows, manifest = pack_docs(tmp_path, docs, 4)
    assert [r["input_ids"] for r in rows] == [[1, 2, 3, 4], [8, 9, 10, 5], [6, 7, 11, 0]]
    assert [r["cu_seqlens"] for r in rows] == [[0, 4], [0, 3, 4], [0, 2, 3, 4]]
    five = rows[1]
    assert five["position_ids"][3] == 0 and five["labels"][3] == -100
    assert (five["doc_ids"], five["doc_offsets"]) == ([2, 0], [0, 4])
    real = Counter(t for r in rows for t, s in zip(r["input_ids"], r["segment_ids"]) if s)
    assert real == Counter(t for d in docs for t in d)
    assert sum(real.values()) == 11
    t = manifest.totals.to_dict()
    assert (t["padding_tokens"], t["effective_targets"], t["split_fragments"]) == (1, 6, 1)
    assert t["tokens_dropped"] == t["tokens_truncated"] == 0


@pytest.mark.parametrize("mode,inputs,counts", [
    ("split", [[1, 2, 3, 4], [5, 6, 0, 0]],
     {"split_fragments": 1, "tokens_dropped": 0, "tokens_truncated": 0, "docs_dropped": 0}),
    ("truncate", [[1, 2, 3, 4]],
     {"docs_truncated": 1, "tokens_dropped": 2, "tokens_truncated": 2, "docs_dropped": 0}),
    ("drop", [], {"docs_dropped": 1, "tokens_dropped": 6, "tokens_truncated": 0,
                  "docs_truncated": 0}),
])
def test_B11_long_document_policy_is_explicit_and_counted(tmp_path, mode, inputs, counts):
    """B11: split, truncate and drop each do what they say and count it under the case's
    names, in the manifest and in ``packtool stats --json``: ``tokens_dropped`` is every input
    token not in the output (truncate: 2, drop: 6), ``tokens_truncated`` the part truncation cut;
    in every mode tokens_in = real tokens written + tokens_dropped (6)."""
    rows, manifest = pack_docs(tmp_path, [[1, 2, 3, 4, 5, 6]], 4, "--overflow", mode)
    assert [r["input_ids"] for r in rows] == inputs
    out_real = sum(s != 0 for r in rows for s in r["segment_ids"])
    got = _stats_json(tmp_path / "out")
    assert not got["mismatches"]
    for t in (manifest.totals.to_dict(), got["stats"]):
        for k, v in counts.items():
            assert t[k] == v, k
        assert t["tokens_in"] == 6 == out_real + t["tokens_dropped"] == t["real_tokens"] + \
            t["tokens_dropped"]
        assert t["tokens_lost"] == t["tokens_dropped"]


def test_B11_overflow_error_names_the_row_and_length(tmp_path):
    """B11: --overflow error refuses, naming the file, the row and the length; nothing written."""
    src = write_docs(tmp_path / "in" / "docs.parquet", [[1, 2], [1, 2, 3, 4, 5, 6]])
    out = tmp_path / "out"
    res = invoke(["pack", "--capacity", 4, "--overflow", "error", src, out])
    assert res.exit_code == 1
    assert "docs.parquet" in res.output and "row 1" in res.output and "6 tokens" in res.output
    assert "Traceback" not in res.output
    assert not out.exists()


def test_B25_every_row_has_a_position_zero(tmp_path):
    """B25: a continuation chunk restarts at position 0; every row starts with position 0."""
    rows, _ = pack_docs(tmp_path, [[1, 2, 3, 4, 5, 6]], 4)
    assert rows[0]["input_ids"] == [1, 2, 3, 4]
    assert rows[0]["position_ids"] == [0, 1, 2, 3]
    assert rows[0]["cu_seqlens"] == [0, 4]
    assert rows[1]["input_ids"] == [5, 6, 0, 0]
    assert rows[1]["position_ids"] == [0, 1, 0, 1]
    assert rows[1]["cu_seqlens"] == [0, 2, 4]
    assert rows[1]["labels"] == [-100, 6, -100, -100]
    assert all(r["position_ids"][0] == 0 and r["cu_seqlens"][0] == 0 for r in rows)


def test_B27_per_token_columns_all_have_length_C(tmp_path):
    """B27: input_ids, labels, position_ids and segment_ids are all C long, declared in the schema."""
    rows, _ = pack_docs(tmp_path, [[1, 2, 3, 4, 5]], 8)
    assert rows[0]["position_ids"] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert rows[0]["cu_seqlens"] == [0, 5, 8]
    rng = random.Random(27)
    docs = [[rng.randrange(1, 1000) for _ in range(rng.randint(1, 20))] for _ in range(50)]
    rows, _ = pack_docs(tmp_path / "random", docs, 16)
    for r in rows:
        assert (len(r["input_ids"]) == len(r["labels"]) == len(r["position_ids"])
                == len(r["segment_ids"]) == 16)
    schema = pq.read_schema(tmp_path / "random" / "out" / "part-00000.parquet")
    for name in ("input_ids", "labels", "position_ids", "segment_ids"):
        typ = schema.field(name).type  # fixed_size_list<int32>[C]: the length is in the type
        assert pa.types.is_fixed_size_list(typ) and typ.list_size == 16
        assert typ.value_type == pa.int32()
    check_output(rows, docs, 16)


def test_B28_position_ids_are_int32_and_below_C(tmp_path):
    """B28: positions are an integer list (int32, documented) with exact values below C."""
    rows, _ = pack_docs(tmp_path, AB, 6)
    schema = pq.read_schema(tmp_path / "out" / "part-00000.parquet")
    assert schema.field("position_ids").type.value_type == pa.int32()
    assert rows[0]["position_ids"] == [0, 1, 2, 0, 1, 0]
    assert max(rows[0]["position_ids"]) < 6


# ---- B34: best-fit-decreasing against a naive O(N^2) reference written here ----------------

def naive_best_fit_decreasing(lengths, capacity):
    """Bins as lists of (doc, offset, length) in placement order, bins in creation order.

    Chunks of C (the last shorter) sorted by length descending, ties by document then chunk;
    each goes to the open bin with the smallest remaining capacity that fits; among equal
    remaining capacities, the bin that reached it most recently (packtool's documented rule).
    """
    chunks = []
    for d, n in enumerate(lengths):
        for k, off in enumerate(range(0, n, capacity)):
            chunks.append((-min(capacity, n - off), d, k, off))
    chunks.sort()
    bins, remaining, stamp = [], [], []
    for clock, (neg, d, _, off) in enumerate(chunks):
        n = -neg
        best = None
        for b in range(len(bins)):
            if remaining[b] >= n and (best is None or remaining[b] < remaining[best]
                                      or (remaining[b] == remaining[best]
                                          and stamp[b] > stamp[best])):
                best = b
        if best is None:
            bins.append([])
            remaining.append(capacity)
            stamp.append(clock)
            best = len(bins) - 1
        bins[best].append((d, off, n))
        remaining[best] -= n
        stamp[best] = clock
    return bins


def plan_bins(plan):
    return [[(int(plan.seg_doc[q]), int(plan.seg_offset[q]), int(plan.seg_len[q]))
             for q in range(plan.row_offsets[r], plan.row_offsets[r + 1])]
            for r in range(plan.num_rows)]


def test_B34b_obfd_equals_naive_best_fit_on_500_random_cases():
    """B34(b): the segment-tree packer assigns exactly the bins a naive O(N^2) best-fit does."""
    rng = np.random.default_rng(34)
    for _ in range(500):
        capacity = int(rng.integers(2, 65))
        lengths = rng.integers(0, 2 * capacity, size=int(rng.integers(0, 51)))
        plan = pack_lengths(lengths, capacity, strategy="obfd", overflow="split")
        assert plan_bins(plan) == naive_best_fit_decreasing(lengths.tolist(), capacity), (
            capacity, lengths.tolist())


def test_B34b_cli_rows_match_naive_best_fit(tmp_path):
    """B34(b) through the CLI: rows and their segments follow the naive reference."""
    rng = random.Random(341)
    docs = [[rng.randrange(1, 50) for _ in range(rng.randint(0, 40))] for _ in range(50)]
    rows, _ = pack_docs(tmp_path, docs, 23)
    expect = naive_best_fit_decreasing([len(d) for d in docs], 23)
    assert [list(zip(r["doc_ids"], r["doc_offsets"])) for r in rows] == [
        [(d, off) for d, off, _ in b] for b in expect]
    check_output(rows, docs, 23)


def test_B34a_200k_documents_pack_near_the_lower_bound():
    """B34(a), untimed here: 200,000 lengths uniform in 1..2048 (seed 0), C=4096; every token
    placed once, no row over C, few rows over ceil(tokens / C). Time printed (see -s)."""
    lengths = np.random.default_rng(0).integers(1, 2049, size=200_000)
    t0 = time.perf_counter()
    plan = pack_lengths(lengths, 4096)
    seconds = time.perf_counter() - t0
    print(f"B34(a): {plan.num_rows} rows in {seconds:.3f} s")
    assert plan.row_lengths().max() <= 4096
    assert np.array_equal(np.bincount(plan.seg_doc, weights=plan.seg_len, minlength=200_000),
                          lengths)
    assert plan.num_rows - -(-int(lengths.sum()) // 4096) <= 2


# ---- the kinds of fault, as properties over random inputs through the CLI ------------------

docs_st = st.lists(st.lists(st.integers(0, 60), max_size=14), min_size=1, max_size=10).filter(
    lambda ds: any(ds))
settings_small = settings(max_examples=20, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])


def _pack(tmp_path, docs, capacity, strategy, *extra):
    import shutil
    shutil.rmtree(tmp_path / "prop", ignore_errors=True)
    rows, manifest = pack_docs(tmp_path / "prop", docs, capacity, "--strategy", strategy, *extra)
    return rows, manifest


strategies = st.sampled_from(["obfd", "ordered", "concat"])


@settings_small
@given(docs=docs_st, capacity=st.integers(2, 9), strategy=strategies)
def test_kind_B01_B25_positions_zero_at_every_segment_start(tmp_path, docs, capacity, strategy):
    """Kind of B01/B25: position 0 at every segment start and at index 0 of every row."""
    rows, _ = _pack(tmp_path, docs, capacity, strategy)
    for r in rows:
        seg, pos = r["segment_ids"], r["position_ids"]
        assert pos[0] == 0
        for j in range(1, capacity):
            if seg[j] != seg[j - 1]:
                assert pos[j] == 0
            else:
                assert pos[j] == pos[j - 1] + 1


@settings_small
@given(docs=docs_st, capacity=st.integers(2, 9), strategy=strategies,
       labels=st.sampled_from(["unshifted", "shifted"]))
def test_kind_B03_B04_B05_no_label_crosses_a_segment(tmp_path, docs, capacity, strategy, labels):
    """Kind of B03/B04/B05: every target comes from the same segment, shifted exactly once."""
    rows, _ = _pack(tmp_path, docs, capacity, strategy, "--labels", labels)
    step = 0 if labels == "unshifted" else 1
    for r in rows:
        seg, ids, lab = r["segment_ids"], r["input_ids"], r["labels"]
        for j in range(capacity):
            if lab[j] == IGNORE:
                continue
            src = j + step  # the token the label at j is
            prev = src - 1  # the token that predicts it
            assert seg[j] != 0 and 0 <= prev and src < capacity
            assert seg[src] == seg[prev] == seg[j] and lab[j] == ids[src]
        assert r["num_targets"] == sum(n - 1 for _, n in segments_of(r))


@settings_small
@given(docs=docs_st, capacity=st.integers(2, 9), strategy=strategies)
def test_kind_B07_B08_cu_seqlens_strictly_increasing_to_C(tmp_path, docs, capacity, strategy):
    """Kind of B07/B08: cu_seqlens starts at 0, never repeats, ends at C, max_seqlen matches."""
    rows, _ = _pack(tmp_path, docs, capacity, strategy)
    for r in rows:
        cu = r["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == capacity
        assert all(a < b for a, b in zip(cu, cu[1:]))
        assert r["max_seqlen"] == max(b - a for a, b in zip(cu, cu[1:]))


@settings_small
@given(docs=docs_st, capacity=st.integers(2, 9), strategy=strategies,
       pad_id=st.integers(0, 60))
def test_kind_B27_padding_only_at_the_tail(tmp_path, docs, capacity, strategy, pad_id):
    """Kind of B27: segment 0 (padding) only after every document, all columns C long; a pad id
    equal to a real token id changes nothing (boundaries come from segment_ids, not values)."""
    rows, _ = _pack(tmp_path, docs, capacity, strategy, "--pad-id", pad_id)
    for r in rows:
        seg = r["segment_ids"]
        real = sum(1 for s in seg if s)
        assert seg[:real].count(0) == 0 and seg[real:] == [0] * (capacity - real)
        assert r["input_ids"][real:] == [pad_id] * (capacity - real)
        assert {len(r[k]) for k in ("input_ids", "segment_ids", "position_ids", "labels")} == {
            capacity}


@settings_small
@given(docs=docs_st, capacity=st.integers(2, 9), strategy=strategies,
       overflow=st.sampled_from(["split", "truncate", "drop"]))
def test_kind_B10_B11_tokens_conserved(tmp_path, docs, capacity, strategy, overflow):
    """Kind of B10/B11: tokens_in == tokens out + tokens_dropped (every token not written),
    the truncated tails counted in it and, as their part, in tokens_truncated."""
    rows, manifest = _pack(tmp_path, docs, capacity, strategy, "--overflow", overflow)
    check_output(rows, docs, capacity, overflow=overflow)
    t = manifest.totals.to_dict()
    out_real = sum(1 for r in rows for s in r["segment_ids"] if s)
    assert t["tokens_in"] == sum(map(len, docs))
    assert t["tokens_in"] == out_real + t["tokens_dropped"]
    long_docs = [d for d in docs if len(d) > capacity]
    if overflow == "split" or not long_docs:
        assert t["tokens_dropped"] == t["tokens_truncated"] == 0
    elif overflow == "truncate":
        assert t["tokens_truncated"] == t["tokens_dropped"] == sum(
            len(d) - capacity for d in long_docs)
    else:
        assert t["tokens_dropped"] == sum(map(len, long_docs)) and t["tokens_truncated"] == 0


def _stats_json(out):
    import json

    res = invoke(["stats", "--json", out])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)  # WARNING lines go to stderr


def test_B15_min_fill_leaves_the_partial_row_out_and_stats_describe_what_remains(tmp_path):
    """B15: documents [[1,1,1,1],[2,2,2,2],[3]], C = 4, ``--min-fill 1`` (only full rows):
    2 rows, 8 real tokens, 8 slots, padding 0, fill 1.0 (not 8/12 = 0.667), 1 document and 1
    token dropped; ``stats`` recounts the same from the shards and agrees with the manifest."""
    rows, manifest = pack_docs(tmp_path, [[1, 1, 1, 1], [2, 2, 2, 2], [3]], 4, "--min-fill", 1)
    assert [r["input_ids"] for r in rows] == [[1, 1, 1, 1], [2, 2, 2, 2]]
    t = manifest.totals
    assert (t.rows, t.real_tokens, t.padding_tokens, t.fill) == (2, 8, 0, 1.0)
    assert (t.docs_dropped, t.tokens_dropped, t.rows_dropped) == (1, 1, 1)
    got = _stats_json(tmp_path / "out")
    s = got["stats"]
    assert (s["rows"], s["real_tokens"], s["padding_tokens"], s["fill"]) == (2, 8, 0, 1.0)
    assert (s["docs_dropped"], s["tokens_dropped"], s["rows_dropped"]) == (1, 1, 1)
    assert not got["mismatches"]
    text = invoke(["stats", tmp_path / "out"]).output
    assert "rows under --min-fill     1 planned row left out, 1 token" in text


def test_B15_dropping_every_row_reports_zeros_and_does_not_crash(tmp_path):
    rows, manifest = pack_docs(tmp_path, [[3], [4, 5]], 4, "--min-fill", 1)
    assert rows == []
    s = _stats_json(tmp_path / "out")["stats"]
    assert (s["rows"], s["real_tokens"], s["padding_tokens"], s["fill"]) == (0, 0, 0, 0.0)
    assert (s["docs_dropped"], s["tokens_dropped"]) == (2, 3)


@pytest.mark.parametrize("extra", [(), ("--window-docs", "3"), ("--segment-multiple", "2")])
def test_min_fill_rows_all_reach_it_and_the_recount_agrees(tmp_path, extra):
    """Random documents, some split: every row written holds >= ceil(0.9 C) real tokens, the
    tokens written + dropped + truncated are the tokens read, and the recount (documents cut
    over several segments included) agrees with the manifest."""
    rng = random.Random(5)
    docs = [[rng.randrange(1, 999) for _ in range(rng.randrange(1, 30))] for _ in range(40)]
    rows, manifest = pack_docs(tmp_path, docs, 12, "--min-fill", 0.9, *extra)
    real = [sum(1 for s in r["segment_ids"] if s) for r in rows]
    assert rows and min(real) >= 11
    t = manifest.totals
    assert t.rows_dropped > 0
    assert t.tokens_in == sum(real) + t.tokens_dropped
    assert not _stats_json(tmp_path / "out")["mismatches"]


def test_min_fill_out_of_range_is_a_usage_error(tmp_path):
    src = write_docs(tmp_path / "in.parquet", AB)
    res = invoke(["pack", "--min-fill", "1.5", "-c", 4, src, tmp_path / "out"])
    assert res.exit_code == 2 and "--min-fill" in res.output
    assert not (tmp_path / "out").exists()


def test_default_min_fill_keeps_the_manifest_form(tmp_path):
    """Without --min-fill the manifest lists neither the option nor rows_dropped (outputs packed
    before it existed keep their fingerprint); a rerun with it is refused, naming it."""
    _, manifest = pack_docs(tmp_path, AB, 4)
    raw = manifest.to_dict()
    assert "min_fill" not in raw["options"] and "rows_dropped" not in raw["totals"]
    res = invoke(["pack", "--no-shuffle", "-q", "--labels", "unshifted", "-c", 4, "--min-fill",
                  1, tmp_path / "in" / "docs.parquet", tmp_path / "out"])
    assert res.exit_code != 0 and "min_fill" in res.output, res.output


def test_min_fill_losing_more_than_one_percent_warns(tmp_path):
    import json

    src = write_docs(tmp_path / "in.parquet", [[1, 1, 1, 1], [2, 2, 2, 2], [3]])
    res = invoke(["pack", "--json", "--min-fill", 1, "-c", 4, src, tmp_path / "out"])
    assert res.exit_code == 0, res.output
    warnings = json.loads(res.output[res.output.index("{"):])["warnings"]
    assert len(warnings) == 1 and "--min-fill 1 left out 1 planned row:" in warnings[0]
    assert "(1 of 9)" in warnings[0]


def test_overflow_and_min_fill_warnings_each_name_their_own_losses(tmp_path):
    """--overflow truncate removes most tokens, --min-fill one row of 1 token: the overflow
    warning gives its own figure and advice, and --min-fill (under 1 % here) says nothing."""
    import json

    docs = [[7] * 25, [8] * 30, [9] * 4, [5] * 6, [3]] + [[2] * 10] * 200
    src = write_docs(tmp_path / "in.parquet", docs)
    res = invoke(["pack", "--json", "--overflow", "truncate", "--min-fill", 1, "-c", 10, src,
                  tmp_path / "out"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output[res.output.index("{"):])
    t = got["stats"]
    assert (t["tokens_truncated"], t["rows_dropped"], t["tokens_under_min_fill"]) == (35, 1, 1)
    assert t["tokens_dropped"] == 35 + 1  # the truncated tails and the row under --min-fill
    (w,) = got["warnings"]
    assert w.startswith("--overflow truncate removed") and "(35 of" in w


@pytest.mark.parametrize("extra", [("--min-fill", "0.75"), ("--min-fill", "1")])
def test_min_fill_can_leave_a_document_without_its_first_piece_and_stats_still_agree(tmp_path,
                                                                                    extra):
    """concat with --segment-multiple 2 at C = 8: the first row (1, 2, 3 and the start of the
    10-token document, 5 real tokens in padded spans) is left out, the row holding the rest of
    that document is kept. stats counts 1 document, cut in no segment but the one left, and
    agrees with the manifest (before, it recounted documents from first pieces only)."""
    import json

    rows, manifest = pack_docs(tmp_path, [[1], [2], [3], [4] * 10], 8, "--strategy", "concat",
                               "--segment-multiple", 2, *extra)
    assert [r["doc_ids"] for r in rows] == [[3]]
    res = invoke(["stats", "--json", tmp_path / "out"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["documents"] == 1 and got["stats"]["docs_cut"] == 0 and not got["mismatches"]
    assert manifest.totals.docs_dropped == 3


@pytest.mark.parametrize("seed", range(4))
def test_concat_min_fill_recount_of_documents_and_cuts_equals_the_rows(tmp_path, seed):
    rng = random.Random(seed)
    docs = [[rng.randrange(1, 99)] * rng.randrange(1, 50) for _ in range(60)]
    rows, _ = pack_docs(tmp_path, docs, 40, "--strategy", "concat", "--segment-multiple", 8,
                        "--min-fill", 0.9)
    import json

    pieces = Counter(d for r in rows for d in r["doc_ids"])
    got = json.loads(invoke(["stats", "--json", tmp_path / "out"]).output)
    assert got["documents"] == len(pieces)
    assert got["stats"]["docs_cut"] == sum(1 for c in pieces.values() if c > 1)
    assert not got["mismatches"]


def test_min_fill_losses_of_the_held_out_pack_are_said_too(tmp_path):
    """--holdout with --min-fill: the held-out pack leaves rows out by the same rule, and its
    losses reach the summary, its warnings and --json (they were silent)."""
    import json

    rng = random.Random(3)
    docs = [[rng.randrange(1, 99)] * rng.randrange(1, 40) for _ in range(300)]
    src = write_docs(tmp_path / "in.parquet", docs)
    out = tmp_path / "out"
    res = invoke(["pack", "-c", 10, "--holdout", 0.3, "--min-fill", 0.9, src, out])
    assert res.exit_code == 0, res.output
    got = json.loads(invoke(["stats", "--json", f"{out}-holdout"]).output)["stats"]
    assert got["rows_dropped"] > 0
    assert f"WARNING: held-out pack ({out}-holdout): --min-fill 0.9 left out" in res.output
    assert f"--min-fill 0.9: {got['rows_dropped']} planned rows left out" in res.output
    res = invoke(["pack", "--json", "--overwrite", "-c", 10, "--holdout", 0.3, "--min-fill", 0.9,
                  src, out])
    h = json.loads(res.output[res.output.index("{"):])["holdout"]
    assert h["stats"]["rows_dropped"] == got["rows_dropped"]
    assert any("--min-fill 0.9" in w for w in h["warnings"])


def test_min_fill_that_drops_nothing_still_lists_its_counts(tmp_path):
    """--min-fill given but every row full enough: rows_dropped and tokens_under_min_fill are 0
    in the manifest and in stats --json (present, not missing)."""
    import json

    _, manifest = pack_docs(tmp_path, [[1, 2, 3, 4]], 4, "--min-fill", 0.5)
    assert manifest.to_dict()["totals"]["rows_dropped"] == 0
    s = json.loads(invoke(["stats", "--json", tmp_path / "out"]).output)["stats"]
    assert (s["rows_dropped"], s["tokens_under_min_fill"]) == (0, 0)
