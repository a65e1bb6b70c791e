"""TRL's SFT loss masks are read like an input labels column: ``completion_mask`` (prompt-completion
data) and ``assistant_masks`` (chat templates), 1 on the tokens to learn, 0 elsewhere. A token
whose mask is 0 is never a target after packing; a mask-like column that is not used is named in
the summary rather than ignored in silence.

Semantics read from TRL's SFTTrainer: a token's label is -100 where any applicable mask is 0
(both masks combine); an explicit ``labels`` column already carries them. Here every source
read combines the same way: a token is a target only when each one says so.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import IGNORE, invoke, read_output

# prompt tokens (must never be targets) and responses; the last document has no response
IDS = [[11, 12, 13, 14], [21, 22, 23, 24, 25, 26], [31, 32, 33]]
COMPLETION = [[0, 0, 1, 1], [0, 0, 0, 1, 1, 1], [0, 0, 0]]
PROMPT = [{11, 12}, {21, 22, 23}, {31, 32, 33}]
RESPONSE_TARGETS = 5  # 13 is a document's third token: targets 13, 14 | 24, 25, 26


def _write(path, types=None, **cols):
    path.parent.mkdir(parents=True, exist_ok=True)
    types = types or {}
    pq.write_table(pa.table({k: pa.array(v, pa.list_(types.get(k, pa.int32())))
                             for k, v in cols.items()}), path)
    return path


def _pack(src, out, *extra, capacity=8):
    res = invoke(["pack", "--no-shuffle", "--capacity", capacity, *extra, src, out])
    assert res.exit_code == 0, res.output
    rows, manifest = read_output(out)
    return res.output, rows, manifest


def _targets(rows):
    """(target tokens, prompt tokens that are targets) over every stored unshifted label."""
    got, leaked = [], []
    for r in rows:
        for i, lab in enumerate(r["labels"]):
            if lab == IGNORE:
                continue
            assert lab == r["input_ids"][i], "unshifted labels are the token or -100"
            doc = r["doc_ids"][r["segment_ids"][i] - 1]
            (leaked if lab in PROMPT[doc] else got).append(lab)
        assert r["num_targets"] == sum(x != IGNORE for x in r["labels"])
    return sorted(got), leaked


@pytest.mark.parametrize("name", ["completion_mask", "assistant_masks"])
def test_trl_mask_keeps_prompt_tokens_out_of_the_targets(tmp_path, name):
    src = _write(tmp_path / "in" / "a.parquet", input_ids=IDS, **{name: COMPLETION})
    out_text, rows, manifest = _pack(src, tmp_path / "out")
    got, leaked = _targets(rows)
    assert leaked == [] and got == [13, 14, 24, 25, 26]
    assert manifest.totals.effective_targets == RESPONSE_TARGETS
    assert manifest.labels.stored, "targets carry information: stored"
    assert "loss masks kept" in out_text


def test_boolean_assistant_masks_and_both_masks_combine(tmp_path):
    """Booleans are read as 0/1; with both masks a token is learned only where both are 1."""
    assistant = [[False, True, True, False], [False, False, True, True, True, True],
                 [True, True, True]]
    src = _write(tmp_path / "in" / "a.parquet", types={"assistant_masks": pa.bool_()},
                 input_ids=IDS, completion_mask=COMPLETION, assistant_masks=assistant)
    _, rows, manifest = _pack(src, tmp_path / "out")
    got, leaked = _targets(rows)
    assert leaked == [] and got == [13, 24, 25, 26]


def test_loss_mask_combines_with_labels_and_attention_mask(tmp_path):
    """labels -100, a loss mask 0 and an attention mask 0 all apply: the targets are the tokens
    every one of them keeps."""
    ids = [[11, 12, 13, 14, 0], [21, 22, 23, 24, 25, 26]]
    attn = [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    labels = [[-100, 12, 13, 14, -100], [-100, -100, -100, 24, 25, -100]]
    comp = [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1]]
    src = _write(tmp_path / "in" / "a.parquet", input_ids=ids, attention_mask=attn,
                 labels=labels, completion_mask=comp)
    _, rows, manifest = _pack(src, tmp_path / "out")
    got, leaked = _targets(rows)
    assert leaked == [] and got == [13, 14, 24, 25]
    assert manifest.totals.tokens_attention_masked == 1


def test_loss_mask_value_other_than_0_or_1_is_refused_with_its_row(tmp_path):
    bad = [m[:] for m in COMPLETION]
    bad[1][4] = 2
    src = _write(tmp_path / "in" / "a.parquet", input_ids=IDS, completion_mask=bad)
    res = invoke(["pack", "-q", "--capacity", 8, src, tmp_path / "out"])
    assert res.exit_code == 1
    assert res.output.count("\n") == 1, res.output
    for word in ("row 1 (0-based)", "'completion_mask' holds 2", "--loss-mask-column none"):
        assert word in res.output
    assert not (tmp_path / "out").exists()


def test_ignored_or_unknown_mask_like_columns_are_named_in_the_summary(tmp_path):
    """With --loss-mask-column none the mask is not used: every token is a target, and the
    summary (text and JSON) names the column; so does it for a column packtool never uses."""
    special = [[1, 0, 0, 1], [1, 0, 0, 0, 0, 1], [1, 0, 1]]
    src = _write(tmp_path / "in" / "a.parquet", input_ids=IDS, completion_mask=COMPLETION,
                 special_tokens_mask=special)
    out_text, rows, manifest = _pack(src, tmp_path / "out", "--loss-mask-column", "none")
    assert manifest.totals.effective_targets == sum(len(d) - 1 for d in IDS)
    line = next(ln for ln in out_text.splitlines() if "look like masks" in ln)
    assert "completion_mask (1 file)" in line and "special_tokens_mask (1 file)" in line
    res = invoke(["pack", "--json", "--capacity", 8, src, tmp_path / "out2"])
    summary = json.loads(res.stdout)
    assert list(summary["input_columns_unused"]) == ["special_tokens_mask"]
    res = invoke(["compare", "--capacity", 8, src])
    assert res.exit_code == 0 and "special_tokens_mask" in res.output, res.output


def test_named_loss_mask_column_is_used_alone(tmp_path):
    """--loss-mask-column NAME reads that column (any name); the TRL columns are then not read
    and are named as unused."""
    src = _write(tmp_path / "in" / "a.parquet", input_ids=IDS, learn=COMPLETION,
                 assistant_masks=[[1] * len(d) for d in IDS])
    out_text, rows, _ = _pack(src, tmp_path / "out", "--loss-mask-column", "learn")
    got, leaked = _targets(rows)
    assert leaked == [] and got == [13, 14, 24, 25, 26]
    assert "assistant_masks (1 file)" in out_text


def test_compare_counts_the_loss_masks_as_pack_does(tmp_path):
    """compare reads INPUT through pack's own path: the same rows, padding and targets."""
    ids = [[(5 * i + j) % 40 + 3 for j in range(3 + i % 11)] for i in range(50)]
    comp = [[int(j >= len(d) // 2) for j in range(len(d))] for d in ids]
    src = _write(tmp_path / "in" / "a.parquet", input_ids=ids, completion_mask=comp)
    opts = ["--append-eos", 2, "--prepend-bos", 1]
    res = invoke(["compare", src, "--capacity", 16, "--json", *opts])
    assert res.exit_code == 0, res.output
    dry = {r["strategy"]: r for r in json.loads(res.stdout)["strategies"]}["obfd"]
    _, _, manifest = _pack(src, tmp_path / "out", *opts, capacity=16)
    t = manifest.totals.to_dict()
    assert (dry["rows"], dry["padding_tokens"], dry["effective_targets"]) == (
        t["rows"], t["padding_tokens"], t["effective_targets"])
    assert dry["effective_targets"] < t["real_tokens"] - t["segments"]  # the mask counts


def test_verify_passes_on_a_pack_with_loss_masks(tmp_path):
    """The column checks accept the extra -100 a loss mask leaves (and only those)."""
    ids = [[(7 * i + j) % 50 + 3 for j in range(5 + i % 9)] for i in range(24)]
    comp = [[int(j >= len(d) // 2) for j in range(len(d))] for d in ids]
    src = _write(tmp_path / "in" / "a.parquet", input_ids=ids, completion_mask=comp)
    _pack(src, tmp_path / "out", capacity=16)
    res = invoke(["verify", tmp_path / "out", "--data-only", "--json"])
    assert res.exit_code == 0, res.output
