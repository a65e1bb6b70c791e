"""``packtool export --to nemo``: read back with the rules NeMo / Megatron-Bridge's packed Parquet
reader applies (``GPTSFTPackedParquetDataset.__getitem__`` then ``GPTSFTPackedDataset.collate_fn``
with ``answer_only_loss=True``, written out here in plain Python), the export holds every document
token for token and every loss-mask bit, and rebuilt into packtool rows it passes verify's column
contract and equals the packed rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import invoke, read_output, stopped_at
from packtool.verify.contract import check_block

IGNORE = -100


def nemo_read(path):
    """Each row as their dataset and collate function see it: one entry per sequence of
    (model inputs, targets, loss mask, positions), plus the row's cu_seqlens."""
    table = pq.read_table(path)
    assert {"input_ids", "loss_mask", "seq_start_id"} <= set(table.column_names)
    out = []
    for r in table.to_pylist():
        ids, mask = r["input_ids"], r["loss_mask"]
        assert len(ids) == len(mask)
        starts = r["seq_start_id"]
        assert starts and starts[0] == 0 and all(a <= b for a, b in zip(starts, starts[1:]))
        bounds = starts + [len(ids)]  # seq_boundaries
        seqs, cu = [], [0]
        for s, e in zip(bounds, bounds[1:]):
            seqs.append((ids[s:e - 1], ids[s + 1:e], mask[s:e - 1], list(range(e - s - 1))))
            cu.append(cu[-1] + e - s - 1)
        # B08: no zero-length sequence (a repeated boundary) reaches a varlen kernel
        assert all(a < b for a, b in zip(cu, cu[1:])), cu
        out.append({"seqs": seqs, "cu_seqlens": cu, "doc_ids": r["doc_ids"],
                    "doc_offsets": r["doc_offsets"],
                    "stored": [ids[s:e] for s, e in zip(bounds, bounds[1:])]})
    return out


def one_token_pieces(packed, docs) -> dict:
    """{document: {offset: [token]}} of the packed rows' one-token segments, which the export
    leaves out (their collate would count a zero-length sequence)."""
    pieces = {}
    for r in packed:  # real tokens of each segment (a --segment-multiple span holds padding)
        real = np.bincount(r["segment_ids"], minlength=len(r["doc_ids"]) + 1)[1:].tolist()
        for n, d, off in zip(real, r["doc_ids"], r["doc_offsets"]):
            if n == 1:
                pieces.setdefault(d, {})[off] = [docs[d]["input_ids"][off]]
    return pieces


def sft_docs(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for d in range(n):
        k = int(rng.integers(1, 30))
        ids = rng.integers(3, 900, size=k).tolist()
        p = int(rng.integers(0, k))
        rows.append({"input_ids": ids, "labels": [IGNORE] * p + ids[p:]})
    return rows


@pytest.mark.parametrize("labels", ["none", "unshifted", "shifted"])
def test_export_round_trips_every_document_and_every_loss_mask_bit(tmp_path, labels):
    docs = sft_docs(900)
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(docs), src)
    out, dest = tmp_path / "out", tmp_path / "nemo"
    assert invoke(["pack", "-q", "-c", 24, "--labels", labels, "--overflow", "split",
                   "--rows-per-shard", 300, src, out]).exit_code == 0
    res = invoke(["export", "--to", "nemo", "--json", out, dest])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    path = dest / "training_24.idx.parquet"
    packed, manifest = read_output(out)
    rows = nemo_read(path)
    # one-token segments are left out (a zero-length sequence to their collate), and a row of
    # nothing else with them; this input has both
    lengths = [np.diff(r["cu_seqlens"]).tolist() for r in packed]
    real = [[n for n, _ in zip(x, r["doc_ids"])] for x, r in zip(lengths, packed)]
    ones = sum(x.count(1) for x in real)
    only_ones = [i for i, x in enumerate(real) if set(x) == {1}]
    assert ones and only_ones
    assert summary["one_token_sequences_left_out"] == ones
    assert summary["rows_left_out"] == len(only_ones)
    assert len(rows) == summary["rows"] == manifest.totals.rows - len(only_ones)
    kept_rows = [r for i, r in enumerate(packed) if i not in only_ones]
    # their writer's row groups: 500 rows
    md = pq.ParquetFile(path).metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)][:-1] == \
        [500] * (md.num_row_groups - 1) and md.num_row_groups >= 2
    # every document token for token (its one-token pieces from the packed rows: left out),
    # and a target exactly where its input label is a token
    rebuilt = {d: {} for d in range(len(docs))}
    for d, at in one_token_pieces(packed, docs).items():
        rebuilt[d].update(at)
    targets = 0
    for r in rows:
        assert len(r["seqs"]) == len(r["doc_ids"])
        for (inp, tgt, mask, pos), piece, d, off in zip(r["seqs"], r["stored"], r["doc_ids"],
                                                        r["doc_offsets"]):
            doc, lab = docs[d]["input_ids"], docs[d]["labels"]
            assert len(piece) >= 2 and off not in rebuilt[d]
            assert piece == doc[off:off + len(piece)] and inp == piece[:-1]
            assert tgt == doc[off + 1:off + len(piece)]
            assert mask == [int(x != IGNORE) for x in lab[off + 1:off + len(piece)]]
            assert pos == list(range(len(inp)))
            rebuilt[d][off] = piece
            targets += sum(mask)
    for d, doc in enumerate(docs):
        joined = [t for off in sorted(rebuilt[d]) for t in rebuilt[d][off]]
        assert joined == doc["input_ids"], d
    assert targets == manifest.totals.effective_targets == summary["targets"]
    meta = json.loads((dest / "24_metadata.jsonl").read_text())
    assert meta[0]["split"] == "training" and meta[0]["pack_size"] == 24
    assert meta[0]["max_samples_per_bin"] == max(len(r["doc_ids"]) for r in rows)

    # rebuilt as packtool rows of capacity C, the export passes verify's column contract and
    # equals the packed rows (labels in the shifted convention, the one loss_mask carries)
    C = 24
    cols = {k: [] for k in ("input_ids", "segment_ids", "position_ids", "labels", "cu_seqlens",
                            "doc_ids", "max_seqlen", "num_targets")}
    for r in rows:
        ids, seg, pos, lab, cu = [], [], [], [], [0]
        for q, ((inp, tgt, mask, _), piece) in enumerate(zip(r["seqs"], r["stored"]), 1):
            ids += piece
            seg += [q] * len(piece)
            pos += list(range(len(piece)))
            lab += [t if m else IGNORE for t, m in zip(tgt, mask)] + [IGNORE]
            cu.append(len(ids))
        pad = C - len(ids)
        cols["input_ids"].append(ids + [0] * pad)
        cols["segment_ids"].append(seg + [0] * pad)
        cols["position_ids"].append(pos + list(range(pad)))
        cols["labels"].append(lab + [IGNORE] * pad)
        cols["cu_seqlens"].append(np.array(cu + ([C] if pad else [])))
        cols["doc_ids"].append(np.array(r["doc_ids"]))
        cols["max_seqlen"].append(int(np.diff(cols["cu_seqlens"][-1]).max()))
        cols["num_targets"].append(sum(x != IGNORE for x in lab))
    block = {k: (np.array(v) if k not in ("cu_seqlens", "doc_ids") else v)
             for k, v in cols.items()}
    assert check_block(block, C, "shifted", label_masked=True) == []
    from packtool.formats.packed import PackedOutput

    # rows without a one-token segment come back exactly
    reader = PackedOutput.open(out)
    originals = [b.row(j) for b in reader.iter_blocks() for j in range(b.num_rows)]
    kept = [i for i in range(len(packed)) if i not in only_ones]
    from packtool.loader import PackedDataset

    ds = PackedDataset(out, labels="shifted")
    exact = 0
    for i, p in enumerate(kept):
        if 1 in real[p]:
            continue
        orig = originals[p]
        for k in ("input_ids", "segment_ids", "position_ids"):
            assert block[k][i].tolist() == orig[k].tolist(), (i, k)
        assert block["cu_seqlens"][i].tolist() == orig["cu_seqlens"].tolist()
        assert block["num_targets"][i] == orig["num_targets"]
        assert block["labels"][i].tolist() == ds[p]["labels"].tolist()
        exact += 1
    assert exact > len(kept) // 2
    assert len(kept_rows) == len(rows)


def test_export_refuses_to_overwrite_and_names_what_is_wrong(tmp_path):
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(sft_docs(20)), src)
    out, dest = tmp_path / "out", tmp_path / "nemo"
    assert invoke(["pack", "-q", "-c", 32, src, out]).exit_code == 0
    assert invoke(["export", "--to", "nemo", out, dest]).exit_code == 0
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    res = invoke(["export", "--to", "nemo", out, dest])  # the same export again: as pack, a no-op
    assert res.exit_code == 0 and "already holds this export" in res.output, res.output
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    # another packed output's export into the same file is refused without --overwrite
    src2 = tmp_path / "docs2.parquet"
    pq.write_table(pa.Table.from_pylist(sft_docs(21)), src2)
    assert invoke(["pack", "-q", "-c", 32, src2, tmp_path / "out2"]).exit_code == 0
    res = invoke(["export", "--to", "nemo", tmp_path / "out2", dest])
    assert res.exit_code == 1 and "training_32.idx.parquet: exists; pass --overwrite" in res.output
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    assert invoke(["export", "--to", "nemo", "--overwrite", out, dest]).exit_code == 0
    res = invoke(["export", "--to", "nemo", "--split", "validation", out, dest])
    assert res.exit_code == 0
    meta = json.loads((dest / "32_metadata.jsonl").read_text())
    assert sorted(m["split"] for m in meta) == ["training", "validation"]
    assert sorted(p.name for p in dest.iterdir()) == [
        "32_metadata.jsonl", "training_32.idx.parquet", "validation_32.idx.parquet"]
    res = invoke(["export", "--to", "nemo", tmp_path, tmp_path / "x"])
    assert res.exit_code == 1 and "Error:" in res.output and len(res.output.splitlines()) == 1


def test_export_refuses_a_dest_in_a_store_or_overlapping_output(tmp_path, monkeypatch):
    """DEST that is OUTPUT, lies inside it or contains it would put files into the packed
    dataset; DEST in a store is not written (pyarrow's own error, and a local ./s3: folder made
    before it): each is one line, before anything is written anywhere."""
    from packcheck import hash_tree

    src = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(sft_docs(10)), src)
    out = tmp_path / "p" / "out"
    assert invoke(["pack", "-q", "-c", 32, src, out]).exit_code == 0
    before = hash_tree(tmp_path / "p")
    monkeypatch.chdir(tmp_path)
    for dest, says in ((out, "overlaps the packed OUTPUT"), (out / "nemo", "overlaps"),
                       (tmp_path / "p", "overlaps"), ("s3://bucket/x/", "local directory"),
                       ("s3:/bucket/x", "local directory")):
        res = invoke(["export", "--to", "nemo", out, dest])
        assert res.exit_code == 1, (dest, res.output)
        [line] = res.output.strip().splitlines()
        assert line.startswith("Error: ") and says in line, line
        assert hash_tree(tmp_path / "p") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.parquet", "p"]


def test_export_refuses_a_dest_that_is_inside_or_holds_another_packtool_output(tmp_path):
    """pack --holdout, then the held-out output exported into the training OUTPUT (or inside
    it, or into a folder holding another output, or into a pack's interrupted scratch): one
    line naming that output, and nothing written, so that output stays a Parquet dataset
    that pyarrow opens and that its own pack --overwrite replaces."""
    import pyarrow.dataset as ds
    from packcheck import hash_tree

    src = tmp_path / "in" / "docs.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": [list(range(1, n % 20 + 3)) for n in range(200)]}),
                   src)
    train, held = tmp_path / "p", tmp_path / "p-holdout"
    assert invoke(["pack", "-q", "-c", 16, "--holdout", 0.2, src, train]).exit_code == 0
    other = tmp_path / "a" / "b" / "q"
    assert invoke(["pack", "-q", "-c", 16, src, other]).exit_code == 0
    stopped = tmp_path / "stopped"  # what an interrupted pack keeps: its scratch only
    (stopped / ".packtool-tmp").mkdir(parents=True)
    before = hash_tree(tmp_path)
    for dest, how, what in [(train, "is", train), (train / "nemo", "lies inside", train),
                            (tmp_path / "a", "contains", other),
                            (stopped / "x", "lies inside", stopped)]:
        res = invoke(["export", "--to", "nemo", held, dest])
        assert res.exit_code == 1, (dest, res.output)
        [line] = res.output.strip().splitlines()
        assert line.startswith(f"Error: {dest}: DEST {how} the ") and f" {what}: " in line \
            and line.endswith("choose a directory outside every packtool output"), line
        assert hash_tree(tmp_path) == before
    assert ds.dataset(train).count_rows() == len(read_output(train)[0])
    assert invoke(["pack", "-q", "-c", 16, "--overwrite", src, train]).exit_code == 0


@pytest.mark.parametrize("labels", ["none", "shifted"])
def test_export_of_a_segment_multiple_output_keeps_real_tokens_only(tmp_path, labels):
    """--segment-multiple pads each document inside its span: the export drops that padding
    too, starts each sequence at its first real token and marks every real target (docs
    [11,12,13],[21,22], C = 8, N = 2: the exact rows), and on a larger input holds every
    document token for token with the pack's effective targets."""
    src = tmp_path / "tiny.parquet"
    pq.write_table(pa.table({"input_ids": [[11, 12, 13], [21, 22]]}), src)
    out, dest = tmp_path / "out", tmp_path / "nemo"
    assert invoke(["pack", "-q", "-c", 8, "--no-shuffle", "--segment-multiple", 2,
                   "--labels", labels, src, out]).exit_code == 0
    assert invoke(["export", "--to", "nemo", out, dest]).exit_code == 0
    row = pq.read_table(dest / "training_8.idx.parquet").to_pylist()[0]
    assert row["input_ids"] == [11, 12, 13, 21, 22]
    assert row["seq_start_id"] == [0, 3]
    assert row["loss_mask"] == [1, 1, 0, 1, 0]

    docs = sft_docs(400, seed=3)
    big = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(docs), big)
    out2, dest2 = tmp_path / "out2", tmp_path / "nemo2"
    assert invoke(["pack", "-q", "-c", 32, "--segment-multiple", 8, "--labels", labels,
                   big, out2]).exit_code == 0
    assert invoke(["export", "--to", "nemo", out2, dest2]).exit_code == 0
    rows = nemo_read(dest2 / "training_32.idx.parquet")
    packed2, manifest = read_output(out2)
    pieces, targets = one_token_pieces(packed2, docs), 0
    for r in rows:
        for (inp, tgt, mask, _), piece, d, off in zip(r["seqs"], r["stored"], r["doc_ids"],
                                                        r["doc_offsets"]):
            doc, lab = docs[d]["input_ids"], docs[d]["labels"]
            assert piece == doc[off:off + len(piece)] and off not in pieces.get(d, {})
            assert mask == [int(x != IGNORE) for x in lab[off + 1:off + len(piece)]]
            pieces.setdefault(d, {})[off] = piece
            targets += sum(mask)
    for d, doc in enumerate(docs):
        assert [t for off in sorted(pieces[d]) for t in pieces[d][off]] == doc["input_ids"], d
    assert targets == manifest.totals.effective_targets


@pytest.fixture(scope="module")
def two_outputs(tmp_path_factory):
    """Two packed outputs of C = 24 (the second of other documents) and an undisturbed export
    of the first."""
    base = tmp_path_factory.mktemp("export")
    outs = []
    for seed, n in ((0, 900), (1, 40)):
        src = base / f"docs{seed}.parquet"
        pq.write_table(pa.Table.from_pylist(sft_docs(n, seed=seed)), src)
        outs.append(base / f"out{seed}")
        assert invoke(["pack", "-q", "-c", 24, "--rows-per-shard", 100, src,
                       outs[-1]]).exit_code == 0
    ref = base / "ref"
    assert invoke(["export", "--to", "nemo", outs[0], ref]).exit_code == 0
    return outs[0], outs[1], ref


def _stop_export(out, dest, sig, *extra) -> tuple[int, str]:
    """``packtool export`` as a process, paused once its temporary file is open, then sent
    ``sig``; returns (exit status, stderr)."""
    def tmp_open():
        assert list(dest.glob(".training_24.idx.parquet.*.tmp")), "no temporary file yet"

    return stopped_at(["export", "--to", "nemo", *extra, out, dest], "export-block:1", sig,
                      at_pause=tmp_open)


@pytest.mark.parametrize("sig,existing", [("SIGINT", False), ("SIGTERM", True),
                                          ("SIGKILL", True)])
def test_an_interrupted_export_leaves_dest_as_it_was_and_the_rerun_finishes(
        tmp_path, two_outputs, sig, existing):
    """Ctrl-C or SIGTERM while the file is written: exit 130/143, one line saying what DEST
    holds (as before), no temporary file left. SIGKILL leaves its temporary file, which the
    rerun removes. The same command rerun gives the bytes of an undisturbed export."""
    import signal

    from packcheck import hash_tree

    out, other, ref = two_outputs
    dest = tmp_path / "nemo"
    extra = ["--overwrite"] if existing else []
    if existing:  # an older export of other rows, which --overwrite replaces
        assert invoke(["export", "--to", "nemo", other, dest]).exit_code == 0
    before = hash_tree(dest) if existing else None
    signum = getattr(signal, sig)
    code, err = _stop_export(out, dest, signum, *extra)
    if signum == signal.SIGKILL:
        assert code == -signum
        assert list(dest.glob(".*.tmp"))  # what a kill leaves, until the rerun
    else:
        assert code == 128 + signum, err
        [line] = err.strip().splitlines()
        word = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
        said = ("the existing training_24.idx.parquet is unchanged" if existing
                else f"nothing was written into {dest}")
        assert line == f"Error: {word}: {said}; rerun the same command to export", line
        assert (hash_tree(dest) == before) if existing else not dest.exists()
    res = invoke(["export", "--to", "nemo", *extra, out, dest])
    assert res.exit_code == 0, res.output
    assert hash_tree(dest) == hash_tree(ref)


def test_ctrl_c_while_the_file_and_its_entry_are_published_finishes_the_export(
        tmp_path, two_outputs, monkeypatch):
    """A signal between the rename of the file and its metadata entry is held until both are
    written: the export ends as a success, never with the file and no entry."""
    import os
    import signal

    from packcheck import hash_tree

    out, _, ref = two_outputs
    real, sent = os.replace, []

    def replace_then_ctrl_c(src, dst):
        real(src, dst)
        if not sent:
            sent.append(dst)
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(os, "replace", replace_then_ctrl_c)
    res = invoke(["export", "--to", "nemo", out, tmp_path / "nemo"])
    assert sent and res.exit_code == 0, res.output
    assert hash_tree(tmp_path / "nemo") == hash_tree(ref)


def test_ctrl_c_while_output_is_opened_says_nothing_was_written(tmp_path, two_outputs,
                                                                 monkeypatch):
    """Ctrl-C while OUTPUT's manifest and shards are opened, before DEST is touched: the line
    says nothing was written into DEST (it said "interrupted: ; rerun ...")."""
    import signal

    from packtool.formats import nemo

    out, _, _ = two_outputs
    real = nemo._packed_blocks

    def open_then_ctrl_c(*args, **kwargs):
        got = real(*args, **kwargs)
        got[3].close()
        signal.raise_signal(signal.SIGINT)
        return got

    monkeypatch.setattr(nemo, "_packed_blocks", open_then_ctrl_c)
    dest = tmp_path / "nemo"
    res = invoke(["export", "--to", "nemo", out, dest])
    assert res.exit_code == 130, res.output
    assert (f"interrupted: nothing was written into {dest}; rerun the same command to export"
            in res.output), res.output
    assert not dest.exists()


def test_a_rerun_adds_the_metadata_entry_a_killed_export_did_not_write(tmp_path, two_outputs):
    """A process killed after the rename and before the entry (SIGKILL, a lost machine) leaves
    the file without its entry: the same command adds the entry (the file records which export
    wrote it); a file another export wrote is still refused without --overwrite."""
    import shutil

    from packcheck import hash_tree

    out, other, ref = two_outputs
    dest = tmp_path / "nemo"
    shutil.copytree(ref, dest)
    (dest / "24_metadata.jsonl").write_text("[]\n")  # what the kill left
    res = invoke(["export", "--to", "nemo", out, dest])
    assert res.exit_code == 0, res.output
    assert "already exported" in res.output
    assert hash_tree(dest) == hash_tree(ref)
    res = invoke(["export", "--to", "nemo", out, dest])  # complete now: nothing to do
    assert res.exit_code == 0 and "already holds this export" in res.output, res.output
    assert hash_tree(dest) == hash_tree(ref)
    (dest / "24_metadata.jsonl").write_text("[]\n")
    res = invoke(["export", "--to", "nemo", other, dest])  # not this export's file
    assert res.exit_code == 1 and "exists; pass --overwrite" in res.output


def test_a_dest_that_cannot_be_written_is_one_line_naming_dest_and_the_fix(tmp_path,
                                                                           two_outputs,
                                                                           monkeypatch):
    """A read-only DEST: one line naming DEST, the cause, what was written (nothing) and the
    fix, as pack's OUTPUT errors; nothing is left behind."""
    import errno
    from pathlib import Path

    out = two_outputs[0]

    def read_only(self, *a, **kw):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    dest = tmp_path / "rofs" / "nemo"
    res = invoke(["export", "--to", "nemo", out, dest])
    assert res.exit_code == 1, res.output
    [line] = res.output.strip().splitlines()
    assert line == (f"Error: {dest}: DEST cannot be written (Read-only file system); nothing "
                    "was written; choose a writable DEST"), line
    assert not (tmp_path / "rofs").exists()


def test_an_export_short_of_open_files_says_so_not_dest(tmp_path, two_outputs, monkeypatch):
    """Too many open files while the export reads the packed shards or writes DEST: the
    shortage line (the limit, ``ulimit -n``), never "DEST cannot be written"."""
    import errno

    import pyarrow.parquet as pq

    out = two_outputs[0]

    def short(*a, **kw):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(pq, "ParquetWriter", short)
    dest = tmp_path / "nemo"
    res = invoke(["export", "--to", "nemo", out, dest])
    assert res.exit_code == 1, res.output
    [line] = res.output.strip().splitlines()
    assert "too many open files" in line and "ulimit -n" in line, line
    assert "DEST cannot be written" not in line, line


def test_one_token_segments_never_reach_their_collate_as_zero_length_sequences(tmp_path):
    """B08's kind in the export: their collate counts L - 1 tokens a sequence, so a one-token
    segment would be a repeated cu_seqlens boundary. Docs [8,9],[7] and [1,2,3,4,5] at C = 4
    (the last split into [1,2,3,4] and [5]): the rows hold [8,9] and [1,2,3,4]; the row of [5]
    alone is left out; both are counted; the targets are the pack's."""
    src = tmp_path / "d.parquet"
    pq.write_table(pa.table({"input_ids": [[8, 9], [7], [1, 2, 3, 4, 5]]}), src)
    out, dest = tmp_path / "out", tmp_path / "nemo"
    assert invoke(["pack", "-q", "-c", 4, "--no-shuffle", "--strategy", "ordered", src,
                   out]).exit_code == 0
    packed, manifest = read_output(out)
    assert [r["input_ids"] for r in packed] == [[8, 9, 7, 0], [1, 2, 3, 4], [5, 0, 0, 0]]
    res = invoke(["export", "--to", "nemo", "--json", out, dest])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    rows = pq.read_table(dest / "training_4.idx.parquet").to_pylist()
    assert [(r["input_ids"], r["seq_start_id"], r["doc_ids"]) for r in rows] == \
        [([8, 9], [0], [0]), ([1, 2, 3, 4], [0], [2])]
    assert [r["loss_mask"] for r in rows] == [[1, 0], [1, 1, 1, 0]]
    assert (summary["one_token_sequences_left_out"], summary["rows_left_out"]) == (2, 1)
    assert summary["targets"] == manifest.totals.effective_targets == 4
    assert summary["rows"] == 2 and summary["sequences"] == 2 and summary["tokens"] == 6
    meta = json.loads((dest / "4_metadata.jsonl").read_text())[0]
    assert meta["min_packed_seqlen"] == 1 and meta["dataset_max_seqlen"] == 3
    text = invoke(["export", "--to", "nemo", "--overwrite", out, dest]).output
    assert text.splitlines()[0] == (
        "exported 2 rows (2 sequences, 6 tokens, 4 loss-mask targets); 2 one-token sequences "
        "left out (no input, no target; a zero-length sequence to their collate), with the 1 row "
        f"that held nothing else -> {dest / 'training_4.idx.parquet'}")


@pytest.mark.parametrize("docs, rows, left", [
    ([[5, 6, 7, 8, 9], [1, 2, 3, 4, 5]], "2 rows (2 sequences, 10 tokens, 8 loss-mask "
     "targets)", ""),
    ([[5, 6, 7], [8]], "1 row (1 sequence, 3 tokens, 2 loss-mask targets)",
     "; 1 one-token sequence left out (no input, no target; a zero-length sequence to their "
     "collate)"),
    ([[5], [6], [7]], "0 rows (0 sequences, 0 tokens, 0 loss-mask targets)",
     "; 3 one-token sequences left out (no input, no target; a zero-length sequence to their "
     "collate), with the 1 row that held nothing else"),
    ([[5, 6, 7, 8, 9], [1], [2, 3, 4, 5, 6], [3]], "2 rows (2 sequences, 8 tokens, 6 loss-mask "
     "targets)", "; 4 one-token sequences left out (no input, no target; a zero-length "
     "sequence to their collate), with the 2 rows that held nothing else"),
], ids=["none left out", "one sequence", "one row", "two rows"])
def test_the_summary_says_what_was_left_out_in_whole_words(tmp_path, docs, rows, left):
    """`pack -c 8` of documents [[5],[6],[7]], exported: the summary said "3 one-token
    sequences left out (...), so 1 row of nothing else ->", its words after "row" missing.
    Every count of sequences and rows left out (0, 1, many) now reads whole, and equals
    --json's."""
    pq.write_table(pa.table({"input_ids": docs}), tmp_path / "d.parquet")
    out, dest = tmp_path / "out", tmp_path / "nemo"
    C = 4 if len(docs) == 4 else 8
    assert invoke(["pack", "-q", "-c", C, "--no-shuffle", "--strategy", "ordered",
                   tmp_path / "d.parquet", out]).exit_code == 0
    res = invoke(["export", "--to", "nemo", out, dest])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0] == \
        f"exported {rows}{left} -> {dest / f'training_{C}.idx.parquet'}"
    done = json.loads(invoke(["export", "--to", "nemo", "--json", out, dest]).stdout)
    assert f"{done['one_token_sequences_left_out']} one-token" in left or not left
    assert done["rows_left_out"] == (int(left.split("with the ")[1][0]) if "with the" in left
                                     else 0)


def test_a_held_out_output_is_exported_as_the_validation_split(tmp_path):
    """pack --holdout, then export of both outputs into one DEST without --split: the held-out
    rows go to validation_C (they went to training_C; the second export then asked to
    --overwrite the real training file). --split still names the file when given."""
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(sft_docs(200)), src)
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 24, "--holdout", 0.2, src, out]).exit_code == 0
    dest = tmp_path / "nemo"
    assert invoke(["export", "--to", "nemo", out, dest]).exit_code == 0
    res = invoke(["export", "--to", "nemo", tmp_path / "out-holdout", dest])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in dest.glob("*.parquet")) == ["training_24.idx.parquet",
                                                             "validation_24.idx.parquet"]
    held = read_output(tmp_path / "out-holdout")[0]
    assert pq.read_metadata(dest / "validation_24.idx.parquet").num_rows == len(held)
    meta = json.loads((dest / "24_metadata.jsonl").read_text())  # a JSON list, as theirs
    assert sorted(e["split"] for e in meta) == ["training", "validation"]
    res = invoke(["export", "--to", "nemo", "--split", "training", tmp_path / "out-holdout",
                  tmp_path / "asked"])
    assert res.exit_code == 0 and (tmp_path / "asked" / "training_24.idx.parquet").is_file()


@pytest.mark.parametrize("flags, docs", [
    (["--min-fill", "1"], [[1, 2], [3]]),  # 0 rows: every planned row under --min-fill
    (["--labels-column", "labels"], [{"input_ids": [1, 2], "labels": [-100, -100]}]),
], ids=["0 rows", "no targets"])
def test_an_export_with_nothing_to_train_on_warns_as_stats_does(tmp_path, flags, docs):
    """An output of 0 rows (or of no effective target) exported with exit 0 and not a word:
    an empty training file (or one whose every loss-mask bit is 0) for NeMo. The export says
    what ``stats`` says of that output, on stderr, and lists it in --json."""
    rows = [d if isinstance(d, dict) else {"input_ids": d} for d in docs]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 10, *flags, tmp_path / "d.parquet", out]).exit_code == 0
    stats = invoke(["stats", out])
    assert stats.exit_code == 0, stats.output
    said = [ln for ln in stats.stderr.splitlines() if ln.startswith("WARNING: ")]
    assert said
    res = invoke(["export", "--to", "nemo", out, tmp_path / "nemo"])
    assert res.exit_code == 0, res.output
    warned = [ln for ln in res.stderr.splitlines() if ln.startswith("WARNING: ")]
    assert set(said) <= set(warned), (said, warned)
    if "--min-fill" in flags:
        assert warned[0] == f"WARNING: {out} holds 0 rows: the export holds no sequence to " \
            "train on"
        assert pq.read_metadata(tmp_path / "nemo" / "training_10.idx.parquet").num_rows == 0
    res = invoke(["export", "--to", "nemo", "--json", out, tmp_path / "nemo"])  # done already
    assert res.exit_code == 0
    assert json.loads(res.stdout)["warnings"] == [w[len("WARNING: "):] for w in warned]
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("WARNING: ")] == warned


def bridge_collate(path, eos, *, cp_padded=False):
    """Each row as Megatron-Bridge's ``GPTSFTPackedDataset.collate_fn`` (with
    ``answer_only_loss=True``) builds it, its EOS rules written out: ``cu_seqlens`` from
    ``seq_start_id`` (L - 1 a sequence); ``cu_seqlens_q`` with ``pad_seq_to_mult`` > 1
    (``cp_padded``): each sequence ending at its last fed token that is not EOS (all versions
    since 0.3.0); ``loss_mask`` of releases up to 0.6.0: 0 wherever the fed token is EOS;
    ``nemo_cu``: NeMo's (NVIDIA/NeMo, its ``.npy`` reader) ``cu_seqlens_unpadded``, each
    sequence ending after its second fed EOS when it feeds two or more."""
    out = []
    for r in pq.read_table(path).to_pylist():
        ids, mask = r["input_ids"], r["loss_mask"]
        bounds = r["seq_start_id"] + [len(ids)]
        cu, cu_q, nemo_cu, fed_mask, released = [0], [0], [0], [], []
        for s, e in zip(bounds, bounds[1:]):
            fed = ids[s:e - 1]
            cu.append(cu[-1] + len(fed))
            not_eos = [i for i, t in enumerate(fed) if t != eos]
            cu_q.append(cu_q[-1] + ((not_eos[-1] + 1 if not_eos else 0) if cp_padded
                                    else len(fed)))
            at = [i for i, t in enumerate(fed) if t == eos]
            nemo_cu.append(nemo_cu[-1] + (at[1] + 1 if len(at) > 1 else len(fed)))
            fed_mask += mask[s:e - 1]
            released += [0 if t == eos else m for t, m in zip(fed, mask[s:e - 1])]
        out.append({"cu_seqlens": cu, "cu_seqlens_q": cu_q, "nemo_cu": nemo_cu,
                    "loss_mask": fed_mask, "released_loss_mask": released,
                    "doc_ids": r["doc_ids"], "bounds": bounds, "ids": ids})
    return out


def _eos_line(res):
    return [ln for ln in res.stderr.splitlines() if ln.startswith("WARNING: ")
            and "the EOS id" in ln]


def test_documents_holding_eos_before_their_end_are_counted_and_said(tmp_path):
    """Multi-turn chat ending every turn with </s>: docs [1,10,11,2,12,13,2,14,15,2] and
    [1,20,21,22,2], EOS 2, C = 16. Megatron-Bridge's collate does not end a sequence at an
    inner EOS (cu_seqlens_q stays [0, 9, 13] even with pad_seq_to_mult > 1; the [0, 7, 11] of
    NeMo's .npy reader is not this reader's), but its releases up to 0.6.0 zero loss_mask on
    every fed EOS: the targets 12 and 14 are not trained. The export said nothing; it now warns
    in one line, counting the document and naming its input row, with --append-eos known from
    the manifest or --eos-id given."""
    src = tmp_path / "chat.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 10, 11, 2, 12, 13, 2, 14, 15, 2],
                                           [1, 20, 21, 22, 2]]}), src)
    out, plain = tmp_path / "out", tmp_path / "plain"
    assert invoke(["pack", "-q", "-c", 16, "--no-shuffle", "--append-eos", 2, src,
                   out]).exit_code == 0
    assert invoke(["pack", "-q", "-c", 16, "--no-shuffle", src, plain]).exit_code == 0
    res = invoke(["export", "--to", "nemo", out, tmp_path / "nemo"])
    assert res.exit_code == 0, res.output
    path = tmp_path / "nemo" / "training_16.idx.parquet"
    row, = bridge_collate(path, 2, cp_padded=True)
    assert row["cu_seqlens"] == row["cu_seqlens_q"] == [0, 9, 13]
    assert row["nemo_cu"] == [0, 7, 11]
    lost = sum(row["loss_mask"]) - sum(row["released_loss_mask"])
    assert lost == 2 and sum(row["loss_mask"]) == 13
    line = ("WARNING: 1 document holds the EOS id 2 before its last token (first: row 0 "
            f"(0-based) of {src}): Megatron-Bridge releases up to 0.6.0 set loss_mask 0 on "
            "every EOS their collate feeds, so 2 of the 13 targets (each the token right after "
            "such an EOS) are not trained (docs/python-and-text.md)")
    assert _eos_line(res) == [line]
    docs = (Path(__file__).parents[2] / "docs" / "python-and-text.md").read_text()
    assert line.replace(str(src), "chat.parquet") in docs.splitlines()  # the page shows it
    done = json.loads(invoke(["export", "--to", "nemo", "--json", out,
                              tmp_path / "nemo"]).stdout)  # a rerun: nothing to do, same word
    assert done["already_complete"] and done["warnings"] == [line[len("WARNING: "):]]
    assert (done["eos_id"], done["eos_documents"], done["eos_targets"], done["eos_cut"],
            done["eos_first_doc"]) == (2, 1, 2, 0, 0)

    # no --append-eos: the EOS id is unknown and nothing is looked for; --eos-id tells it
    res = invoke(["export", "--to", "nemo", plain, tmp_path / "plain-nemo"])
    assert res.exit_code == 0 and _eos_line(res) == []
    res = invoke(["export", "--to", "nemo", "--json", plain, tmp_path / "plain-nemo"])
    assert json.loads(res.stdout)["eos_id"] is None
    res = invoke(["export", "--to", "nemo", "--eos-id", 2, plain, tmp_path / "plain-nemo"])
    assert res.exit_code == 0 and _eos_line(res) == [line]
    # another id asked of the finished export: its file is read again for that id
    res = invoke(["export", "--to", "nemo", "--eos-id", 11, plain, tmp_path / "plain-nemo"])
    assert _eos_line(res) and "1 of the 13 targets" in _eos_line(res)[0]
    assert invoke(["export", "--to", "nemo", "--eos-id", -1, plain,
                   tmp_path / "x"]).exit_code == 2


def test_the_eos_counts_are_what_their_collate_does_with_the_rows(tmp_path):
    """On many SFT documents holding EOS anywhere (prompt-masked, split across rows, ending
    with two EOS), from two input files: the counts equal what the collate's rules do with the
    exported rows (targets lost to the released loss-mask rule, sequences cut by the
    pad_seq_to_mult rule), the documents are those feeding an EOS, and the first is named by
    its file and row."""
    eos = 2
    rng = np.random.default_rng(5)
    files = []
    for f in range(2):
        rows = []
        for _ in range(300):
            k = int(rng.integers(2, 40))
            ids = rng.choice([eos, 3, 4, 5, 6, 7, 8], size=k, p=[.2] + [.8 / 6] * 6).tolist()
            if rng.random() < .2:
                ids[-2:] = [eos, eos]
            p = int(rng.integers(0, k))
            rows.append({"input_ids": ids, "labels": [IGNORE] * p + ids[p:]})
        if f == 0:  # the first file: no EOS before a document's last token
            rows = [{"input_ids": [t for t in r["input_ids"][:-1] if t != eos] + [eos]}
                    for r in rows]
            rows = [{**r, "labels": r["input_ids"]} for r in rows]
        files.append(tmp_path / "in" / f"{'ab'[f]}.parquet")
        files[-1].parent.mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), files[-1])
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 24, "--overflow", "split", "--append-eos", eos,
                   tmp_path / "in", out]).exit_code == 0
    res = invoke(["export", "--to", "nemo", "--json", out, tmp_path / "nemo"])
    assert res.exit_code == 0, res.output
    done = json.loads(res.stdout)
    rows = bridge_collate(tmp_path / "nemo" / "training_24.idx.parquet", eos, cp_padded=True)
    lost = sum(sum(r["loss_mask"]) - sum(r["released_loss_mask"]) for r in rows)
    cut = sum(sum(1 for a, b, c, d in zip(r["cu_seqlens"], r["cu_seqlens"][1:],
                                          r["cu_seqlens_q"], r["cu_seqlens_q"][1:])
                  if d - c < b - a) for r in rows)
    feeding, first = set(), None
    for r in rows:
        for (s, e), d in zip(zip(r["bounds"], r["bounds"][1:]), r["doc_ids"]):
            if eos in r["ids"][s:e - 1]:
                feeding.add(d)
                first = d if first is None else first
    assert lost and cut and feeding and min(feeding) >= 300
    assert (done["eos_targets"], done["eos_cut"], done["eos_documents"],
            done["eos_first_doc"]) == (lost, cut, len(feeding), first)
    warned, = [w for w in done["warnings"] if "the EOS id" in w]
    assert warned.startswith(f"{len(feeding):,} documents hold the EOS id {eos} before their "
                             f"last token (first: row {first - 300} (0-based) of {files[1]}): ")
    assert f"so {lost:,} of the {done['targets']:,} targets" in warned
    assert f"ends {cut:,} sequences at the last fed token that is not EOS" in warned


@pytest.mark.parametrize("docs", [
    [[5, 6, 2], [7, 2], [8, 9, 10, 11, 12, 13, 14, 15, 16, 2]],  # EOS only at the end (split)
    [{"input_ids": [5, 2, 6, 7, 2], "labels": [5, 2, IGNORE, 7, 2]}],  # no target after it
], ids=["at the end", "no target after it"])
def test_an_eos_their_collate_trains_as_packtool_does_is_not_warned(tmp_path, docs):
    """EOS only as each piece's last token (never fed), or fed with no target after it (the
    next turn's prompt masked): their collate trains the rows as packtool does, so no line."""
    rows = [d if isinstance(d, dict) else {"input_ids": d} for d in docs]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 8, "--append-eos", 2, tmp_path / "d.parquet",
                   out]).exit_code == 0
    res = invoke(["export", "--to", "nemo", "--json", out, tmp_path / "nemo"])
    assert res.exit_code == 0 and _eos_line(res) == []
    done = json.loads(res.stdout)
    assert done["eos_id"] == 2 and done["eos_targets"] == done["eos_cut"] == 0
    assert done["eos_documents"] == (1 if isinstance(docs[0], dict) else 0)
    for r in bridge_collate(tmp_path / "nemo" / "training_8.idx.parquet", 2, cp_padded=True):
        assert r["loss_mask"] == r["released_loss_mask"]
        assert r["cu_seqlens_q"] == r["cu_seqlens"]


def test_the_export_of_a_segment_multiple_output_says_its_layout_is_not_kept(tmp_path):
    """--segment-multiple N pads every piece to a multiple of N inside its span (the
    context-parallel layout); the export drops that padding, so its sequences are not multiples
    of N. Only a docstring said so; the summary now has a note (in --json: notes), an output
    packed without it none."""
    src = tmp_path / "tiny.parquet"
    pq.write_table(pa.table({"input_ids": [[11, 12, 13], [21, 22]]}), src)
    for n in (1, 4):
        out = tmp_path / f"out{n}"
        assert invoke(["pack", "-q", "-c", 8, "--no-shuffle", "--segment-multiple", n, src,
                       out]).exit_code == 0
        res = invoke(["export", "--to", "nemo", out, tmp_path / f"nemo{n}"])
        assert res.exit_code == 0, res.output
        notes = [ln.strip() for ln in res.stdout.splitlines() if ln.strip().startswith("note:")]
        row = pq.read_table(tmp_path / f"nemo{n}" / "training_8.idx.parquet").to_pylist()[0]
        lengths = np.diff(row["seq_start_id"] + [len(row["input_ids"])]).tolist()
        if n == 1:
            assert notes == []
            continue
        assert lengths == [3, 2]  # not multiples of 4: the note says why
        note = (f"packed with --segment-multiple {n}: the export drops the padding inside each "
                f"span, so its sequences keep their real lengths, not padded to multiples of "
                f"{n}: the context-parallel layout is not kept (docs/python-and-text.md)")
        assert notes == [f"note: {note}"]
        again = invoke(["export", "--to", "nemo", "--json", out, tmp_path / f"nemo{n}"])
        assert json.loads(again.stdout)["notes"] == [note]


def test_a_failed_export_removes_every_folder_it_created_and_no_other(tmp_path):
    """An export into x/y/z failing on a damaged shard (after it created DEST) leaves no x/,
    x/y/ nor x/y/z/ (it used to remove z alone); into a DEST under a folder that was there
    (holding a file of its own), only the folders it created go. (--no-hash: the damage is
    then found by its page checksum, once DEST is there; the sha256 would refuse it before.)"""
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(sft_docs(40)), src)
    out = tmp_path / "p3"
    assert invoke(["pack", "-q", "-c", 24, src, out]).exit_code == 0
    shard = next(out.glob("part-*.parquet"))
    raw = bytearray(shard.read_bytes())
    raw[100:140] = bytes(40)  # inside the first data page: it fails its checksum
    shard.write_bytes(bytes(raw))
    res = invoke(["export", "--to", "nemo", "--no-hash", out, tmp_path / "x" / "y" / "z"])
    assert res.exit_code == 1 and "damaged" in res.output, res.output
    assert not (tmp_path / "x").exists()
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "mine.txt").write_text("not the export's")
    res = invoke(["export", "--to", "nemo", "--no-hash", out, tmp_path / "keep" / "y" / "z"])
    assert res.exit_code == 1 and "damaged" in res.output, res.output
    assert [p.name for p in (tmp_path / "keep").iterdir()] == ["mine.txt"]


def _flip_page_byte(shard: Path, column: str) -> None:
    """XOR one byte in the middle of ``column``'s first data page of ``shard`` (its size and
    footer kept), as a disk or network fault would."""
    g = pq.ParquetFile(shard).metadata.row_group(0)
    c = next(g.column(i) for i in range(g.num_columns)
             if g.column(i).path_in_schema.split(".")[0] == column)
    data = bytearray(shard.read_bytes())
    data[c.data_page_offset + c.total_compressed_size // 2] ^= 0x5A
    shard.write_bytes(bytes(data))


@pytest.mark.parametrize("column", ["position_ids", "segment_ids", "max_seqlen", "num_targets",
                                    "source_ids"])
def test_export_checks_every_shards_sha256_as_stats_and_verify_do(tmp_path, column):
    """A flipped byte in a page the export does not decode (position_ids, max_seqlen, ...) was
    exported with exit 0 where stats and verify refused the shard by its sha256. The export
    checks the sha256 of every shard first, in their words, and writes nothing; --no-hash skips
    it as theirs does."""
    src = tmp_path / "in.parquet"
    docs = sft_docs(120)
    pq.write_table(pa.table({"input_ids": [d["input_ids"] for d in docs],
                             "source": [f"s{i % 3}" for i in range(len(docs))]}), src)
    out, dest = tmp_path / "out", tmp_path / "nemo"
    res = invoke(["pack", "-q", "-c", 64, "--rows-per-shard", 10, "--source-column", "source",
                  src, out])
    assert res.exit_code == 0, res.output
    shard = out / "part-00001.parquet"
    _flip_page_byte(shard, column)
    words = f"{shard}: sha256 differs from the manifest: the shard was modified"
    for cmd in (["stats", out], ["verify", "--data-only", out],
                ["export", "--to", "nemo", out, dest]):
        res = invoke(cmd)
        assert res.exit_code == 1 and words in res.output, (cmd, res.output)
    assert not dest.exists()
    from packtool.errors import ManifestError
    from packtool.formats.nemo import export_nemo

    with pytest.raises(ManifestError, match="sha256 differs"):
        export_nemo(out, dest)
    assert not dest.exists()
    if column in ("position_ids", "max_seqlen", "num_targets", "source_ids"):  # not decoded
        res = invoke(["export", "--to", "nemo", "--no-hash", out, dest])
        assert res.exit_code == 0, res.output
        assert "sha256" not in res.output
        export_nemo(out, tmp_path / "nemo2", check_hashes=False)


def test_export_says_the_sha256_was_checked_and_how_to_skip_it(tmp_path):
    src = write_docs_sft(tmp_path / "in.parquet", sft_docs(50))
    out, dest = tmp_path / "out", tmp_path / "nemo"
    assert invoke(["pack", "-q", "-c", 64, src, out]).exit_code == 0
    res = invoke(["export", "--to", "nemo", out, dest])
    assert res.exit_code == 0, res.output
    assert "sha256 of 1 shard" in res.output and "--no-hash skips it" in res.output
    res = invoke(["export", "--to", "nemo", "--json", "--overwrite", out, dest])
    assert json.loads(res.output)["shards_hashed"] == 1
    res = invoke(["export", "--to", "nemo", "--json", "--overwrite", "--no-hash", out, dest])
    assert json.loads(res.output)["shards_hashed"] == 0
    help_text = invoke(["export", "--help"]).output
    assert "--no-hash" in help_text


def write_docs_sft(path: Path, docs) -> Path:
    pq.write_table(pa.table({"input_ids": [d["input_ids"] for d in docs]}), path)
    return path


def test_a_dest_out_of_inodes_says_so_not_bytes(tmp_path, two_outputs, monkeypatch):
    """ENOSPC from a filesystem with no inode free (statvfs's f_favail 0, bytes to spare):
    one line naming inodes and df -i and the fix, not "free space"."""
    import errno
    import os

    import pyarrow.parquet as pq

    real = os.statvfs

    def statvfs(path):
        st = real(path)
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, st.f_bfree,
                                  st.f_bavail, 1000, 0, 0, st.f_flag, st.f_namemax))

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "statvfs", statvfs)
    monkeypatch.setattr(pq, "ParquetWriter", full)
    dest = tmp_path / "nemo"
    res = invoke(["export", "--to", "nemo", two_outputs[0], dest])
    assert res.exit_code == 1, res.output
    [line] = res.output.strip().splitlines()
    assert f"{dest}: DEST cannot be written (no space left on device: the filesystem has run " \
           "out of inodes (files), not bytes (" in line, line
    assert line.endswith("remove files on it that are not needed, or choose another DEST, on a "
                         "filesystem with more inodes"), line


@pytest.mark.parametrize("command", [["export", "--to", "nemo"], ["stats"],
                                     ["verify", "--data-only"]])
def test_an_output_packed_again_while_read_says_to_rerun_the_command(tmp_path, command,
                                                                     monkeypatch):
    """OUTPUT packed again (--overwrite, other rows) after the command read its first block:
    refused (DEST of an export left absent), and the line's fix is to rerun that command, not
    the loader's "open it again (a new dataset or PackedOutput.open)"."""
    import subprocess
    import sys

    from packtool.formats.packed import PackedOutput

    src = tmp_path / "docs.parquet"
    pq.write_table(pa.Table.from_pylist(sft_docs(900)), src)
    out, dest = tmp_path / "out", tmp_path / "nemo"
    pack = ["pack", "-q", "-c", 24, "--rows-per-shard", 20]
    assert invoke([*pack, src, out]).exit_code == 0
    real = PackedOutput.iter_blocks

    def repacked_after_the_first(self, *args, **kwargs):
        for n, block in enumerate(real(self, *args, **kwargs)):
            if n == 1:  # the reader has read ahead: the pack replaces shards not yet opened
                subprocess.run([sys.executable, "-m", "packtool", *map(str, pack), "--overwrite",
                                "--seed", "7", src, out], check=True, capture_output=True)
            yield block

    monkeypatch.setattr(PackedOutput, "iter_blocks", repacked_after_the_first)
    args = [*command, out] + ([dest] if command[0] == "export" else [])
    res = invoke(args)
    assert res.exit_code != 0, res.output
    [line] = [ln for ln in res.output.splitlines() if ln.startswith("Error: ")]
    assert "packed again since it was opened" in line, line
    assert line.endswith(f"rerun the same packtool {command[0]}"), line
    assert "PackedOutput.open" not in line and "dataset" not in line, line
    assert not dest.exists()


@pytest.mark.parametrize("kwargs, said", [
    ({"eos_id": True}, "eos_id=True: must be an integer, not bool"),
    ({"eos_id": 2.7}, "eos_id=2.7: must be an integer, not float"),
    ({"eos_id": 2.0}, "eos_id=2.0: must be an integer, not float"),
    ({"eos_id": "2"}, "eos_id='2': must be an integer, not str"),
    ({"eos_id": -1}, "eos_id=-1: must be >= 0"),
    ({"rows_per_group": True}, "rows_per_group=True: must be an integer, not bool"),
    ({"rows_per_group": 500.0}, "rows_per_group=500.0: must be an integer, not float"),
    ({"rows_per_group": 0}, "rows_per_group=0: must be >= 1"),
    ({"overwrite": "yes"}, "overwrite='yes': must be True or False, not str"),
    ({"check_hashes": 1}, "check_hashes=1: must be True or False, not int"),
    ({"split": "train"}, "split='train': choose training or validation"),
    ({"split": 1}, "split=1: must be a string, not int"),
    ({"dest": 5}, "dest=5: must be a path, not int"),
    ({"out_dir": None}, "out_dir=None: must be a path, not NoneType"),
], ids=lambda v: "-".join(map(str, v)) if isinstance(v, dict) else "")
def test_export_nemo_refuses_arguments_of_another_type_as_pack_does(tmp_path, two_outputs,
                                                                    kwargs, said):
    """export_nemo took eos_id=True (as 1), eos_id=2.7 (as 2) and rows_per_group=True: each
    argument is now checked as packtool.pack checks its own (packtool.config.option_value: a
    bool is not an integer, a float is refused), in one line naming it by its keyword, before
    anything is read or written. A NumPy integer is taken as the equal int."""
    from packtool.errors import ConfigError
    from packtool.formats.nemo import export_nemo

    out, _, _ = two_outputs
    dest = tmp_path / "nemo"
    args = {"out_dir": out, "dest": dest, **kwargs}
    with pytest.raises(ConfigError) as err:
        export_nemo(args.pop("out_dir"), args.pop("dest"), **args)
    assert str(err.value) == said
    assert not dest.exists()
    done = export_nemo(out, dest, eos_id=np.int64(7), rows_per_group=np.int32(9))
    assert type(done.eos_id) is int and done.eos_id == 7
    assert pq.ParquetFile(done.path).metadata.row_group(0).num_rows == 9


def test_the_docs_name_export_nemo_with_its_arguments_and_its_block_runs(tmp_path, monkeypatch,
                                                                         capsys):
    """The docs said "NemoExport.warnings from Python" but named no function: the export
    section names export_nemo with its signature as it is, and its Python block runs as pasted
    on a packed output, giving the command's file."""
    import inspect
    import re

    from packtool.formats.nemo import export_nemo

    page = (Path(__file__).parents[2] / "docs" / "python-and-text.md").read_text()
    sec = page.split("## To NeMo / Megatron-Bridge: `packtool export --to nemo`", 1)[1]
    sec = sec.split("\n## ", 1)[0]
    named = re.search(r"`packtool\.formats\.nemo\.export_nemo\((.*?)\)`", sec, flags=re.S)
    assert named, "the export section names no export_nemo(...)"
    params = [p for p in inspect.signature(export_nemo).parameters.values()]
    said = ", ".join([p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] + ["*"] + [
        f"{p.name}={p.default!r}" for p in params if p.kind is p.KEYWORD_ONLY])
    assert " ".join(named.group(1).split()) == said
    [code] = re.findall(r"```python\n(.*?)```", sec, flags=re.S)
    src = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(sft_docs(60)), src)
    monkeypatch.chdir(tmp_path)
    assert invoke(["pack", "-q", "-c", 24, src, "packed"]).exit_code == 0
    exec(compile(code, "python-and-text.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    done = pq.read_metadata(tmp_path / "nemo" / "training_24.idx.parquet")
    assert printed[0].startswith(f"{done.num_rows} rows, ")
    res = invoke(["export", "--to", "nemo", "--json", "packed", "nemo"])  # the command's file
    assert res.exit_code == 0 and json.loads(res.stdout)["already_complete"], res.output
