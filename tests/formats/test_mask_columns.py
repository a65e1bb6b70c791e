"""Mask columns read with the tokens: attention_mask zeros removed, labels -100 flagged.

A padded tokenization's pad tokens must not be packed and trained on; an SFT example's prompt
(labels -100) must not become targets. The reader is where both are taken in.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.errors import SchemaError
from packtool.formats.reader import AUTO
from packtool.pipeline.read import iter_documents

IDS = [[5, 6, 7, 0, 0], [8, 9, 0, 0, 0], [1, 2, 3, 4, 5]]
MASK = [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
LABELS = [[-100, 6, 7, -100, -100], [-100, -100, -100, -100, -100], [-100, -100, 3, 4, 5]]


def _write(path, **cols):
    table = pa.table({k: pa.array(v, pa.list_(pa.int64())) for k, v in cols.items()})
    pq.write_table(table, path, row_group_size=2)
    return path


def _read(path, **kw):
    batches = list(iter_documents(path, "input_ids", batch_rows=2, **kw))
    docs, flags = [], []
    for tb in batches:
        ends = np.cumsum(tb.lengths)
        docs += [tb.tokens[e - n:e].tolist() for e, n in zip(ends, tb.lengths)]
        if tb.targets is not None:
            flags += [tb.targets[e - n:e].tolist() for e, n in zip(ends, tb.lengths)]
    return docs, flags, sum(tb.masked_tokens for tb in batches)


def test_attention_mask_zeros_are_removed_and_counted(tmp_path):
    src = _write(tmp_path / "a.parquet", input_ids=IDS, attention_mask=MASK)
    docs, flags, masked = _read(src, attention_mask=AUTO)
    assert docs == [[5, 6, 7], [8, 9], [1, 2, 3, 4, 5]]
    assert masked == 5 and flags == []


def test_labels_minus_100_become_non_target_flags(tmp_path):
    src = _write(tmp_path / "a.parquet", input_ids=IDS, attention_mask=MASK, labels=LABELS)
    docs, flags, masked = _read(src, attention_mask=AUTO, labels=AUTO)
    assert docs == [[5, 6, 7], [8, 9], [1, 2, 3, 4, 5]]
    assert flags == [[0, 1, 1], [0, 0], [0, 0, 1, 1, 1]]


def test_mask_columns_are_off_by_default_in_the_reader_and_with_none(tmp_path):
    src = _write(tmp_path / "a.parquet", input_ids=IDS, attention_mask=MASK, labels=LABELS)
    assert _read(src)[0] == IDS
    assert _read(src, attention_mask=None, labels=None)[0] == IDS


def test_auto_without_mask_columns_reads_tokens_only(tmp_path):
    src = _write(tmp_path / "a.parquet", input_ids=IDS)
    assert _read(src, attention_mask=AUTO, labels=AUTO) == (IDS, [], 0)


def test_named_mask_column_missing_is_refused(tmp_path):
    src = _write(tmp_path / "a.parquet", input_ids=IDS)
    with pytest.raises(SchemaError, match="no column 'loss_labels' for --labels-column"):
        _read(src, labels="loss_labels")


def test_mask_row_of_another_length_is_refused_with_the_row(tmp_path):
    bad = [m[:] for m in MASK]
    bad[2] = bad[2][:4]
    src = _write(tmp_path / "a.parquet", input_ids=IDS, attention_mask=bad)
    with pytest.raises(SchemaError,
                       match=r"row 2 \(0-based\): 'attention_mask' has 4 entries for 5 tokens"):
        _read(src, attention_mask=AUTO)


def test_label_that_is_not_its_token_is_refused(tmp_path):
    """Shifted or remapped labels cannot be kept as a mask without changing the targets."""
    bad = [row[:] for row in LABELS]
    bad[2][3] = 5
    src = _write(tmp_path / "a.parquet", input_ids=IDS, labels=bad)
    with pytest.raises(SchemaError,
                       match=r"row 2 \(0-based\): label 5 is neither -100 nor its token 4"):
        _read(src, labels=AUTO)


def test_boolean_attention_mask_is_applied_under_auto(tmp_path):
    """A list<bool> attention_mask (common from tokenizers) removes its False tokens."""
    table = pa.table({"input_ids": pa.array(IDS, pa.list_(pa.int64())),
                      "attention_mask": pa.array([[bool(v) for v in m] for m in MASK],
                                                 pa.list_(pa.bool_()))})
    src = tmp_path / "b.parquet"
    pq.write_table(table, src)
    docs, _, masked = _read(src, attention_mask=AUTO)
    assert docs == [[5, 6, 7], [8, 9], [1, 2, 3, 4, 5]] and masked == 5


@pytest.mark.parametrize("name,typ", [("attention_mask", pa.list_(pa.float64())),
                                      ("attention_mask", pa.list_(pa.string())),
                                      ("labels", pa.list_(pa.float32())),
                                      ("labels", pa.list_(pa.bool_()))])
def test_auto_refuses_a_present_mask_column_of_another_type(tmp_path, name, typ):
    """Under auto a present mask column that cannot be used is an error, never skipped."""
    cast = {pa.types.is_string: str, pa.types.is_boolean: bool}
    conv = next((f for test, f in cast.items() if test(typ.value_type)), lambda v: v)
    vals = [[conv(v) for v in m] for m in MASK]
    table = pa.table({"input_ids": pa.array(IDS, pa.list_(pa.int64())),
                      name: pa.array(vals, typ)})
    src = tmp_path / "c.parquet"
    pq.write_table(table, src)
    with pytest.raises(SchemaError, match=f"{name}.*none"):
        _read(src, attention_mask=AUTO, labels=AUTO)
    assert _read(src, attention_mask=None, labels=None)[0] == IDS
