"""``pack --holdout FRACTION``: a seeded split of whole documents into a second packed output that
shares no document with the training rows, with the same contract and its own manifest."""

from __future__ import annotations

import json
import re
import signal

import numpy as np
import pytest

from packcheck import (check_output, hash_pack, hash_tree, invoke, paused_pack, read_output,
                       stopped_at, write_docs)
from packtool.core.holdout import count_held_out, drop_documents, holdout_mask
from packtool.errors import ManifestError
from packtool.formats.manifest import read_manifest

MASK64 = (1 << 64) - 1


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def naive_held_out(d: int, fraction: float, seed: int) -> bool:
    """SplitMix64 written out with Python ints (the documented rule, no NumPy)."""
    key = _mix(seed ^ 0x686F6C646F75742E)
    z = _mix((key + (d + 1) * 0x9E3779B97F4A7C15) & MASK64)
    return (z >> 11) < int(fraction * 2**53)


def test_holdout_mask_is_the_documented_splitmix_rule():
    """The vectorised mask equals the rule written out with Python integers."""
    for seed, fraction in ((0, 0.1), (7, 0.5), (2**63 - 1, 0.03)):
        got = holdout_mask(1000, 300, fraction, seed)
        want = [naive_held_out(d, fraction, seed) for d in range(1000, 1300)]
        assert got.tolist() == want


def test_holdout_decision_depends_on_the_document_alone():
    """Cut anywhere, the decisions are the same: windows never change the held-out set."""
    whole = holdout_mask(0, 10_000, 0.2, 3)
    parts = np.concatenate([holdout_mask(lo, 777, 0.2, 3)[:min(777, 10_000 - lo)]
                            for lo in range(0, 10_000, 777)])
    assert np.array_equal(whole, parts)
    assert count_held_out(10_000, 0.2, 3, chunk=1000) == int(whole.sum())
    assert 1800 < whole.sum() < 2200  # about the fraction asked for
    assert not np.array_equal(whole, holdout_mask(0, 10_000, 0.2, 4))  # the seed matters


def test_drop_documents_keeps_lengths_aligned():
    lengths = np.array([2, 0, 3, 1])
    tokens = np.arange(6, dtype=np.int32)
    flags = np.array([1, 0, 1, 1, 0, 1], dtype=np.uint8)
    new, docs, toks, t2, f2 = drop_documents(lengths, np.array([True, True, False, True]),
                                             tokens, flags)
    assert new.tolist() == [2, 0, 0, 1] and (docs, toks) == (1, 3)
    assert t2.tolist() == [0, 1, 5] and f2.tolist() == [1, 0, 1]


def _docs(n=120, seed=0):
    rng = np.random.default_rng(seed)
    # distinct tokens per document (doc d uses d*1000 + i), some empty, some over capacity
    return [[] if d % 17 == 5 else [d * 1000 + i for i in range(int(rng.integers(1, 40)))]
            for d in range(n)]


@pytest.mark.parametrize("extra", [[], ["--window-docs", "25"], ["--strategy", "ordered"]])
def test_holdout_output_shares_no_document_with_the_training_rows(tmp_path, extra):
    """Every non-empty document lands in exactly one of the two outputs, whole; each output
    keeps the contract; the held-out set is the seeded rule's, whatever the windows."""
    docs = _docs()
    src = write_docs(tmp_path / "in" / "a.parquet", docs)
    out, held = tmp_path / "out", tmp_path / "val"
    res = invoke(["pack", "-q", "-c", 32, "--labels", "unshifted", "--holdout", 0.25,
                  "--holdout-output", held, "--seed", 5, *extra, src, out])
    assert res.exit_code == 0, res.output
    rule = holdout_mask(0, len(docs), 0.25, 5)
    train_rows, train_m = read_output(out)
    held_rows, held_m = read_output(held)
    check_output(train_rows, [[] if rule[d] else doc for d, doc in enumerate(docs)], 32)
    check_output(held_rows, [doc if rule[d] else [] for d, doc in enumerate(docs)], 32)
    train_docs = {d for r in train_rows for d in r["doc_ids"]}
    held_docs = {d for r in held_rows for d in r["doc_ids"]}
    assert not train_docs & held_docs
    assert held_docs == {d for d in range(len(docs)) if rule[d] and docs[d]}
    # two manifests, each saying which side it holds and counting the other side
    assert train_m.options["holdout_part"] == "train"
    assert held_m.options["holdout_part"] == "holdout"
    assert train_m.fingerprint != held_m.fingerprint
    n_held = int(rule.sum())
    assert train_m.totals.docs_other_split == n_held
    assert held_m.totals.docs_other_split == len(docs) - n_held
    empty = sum(1 for d in docs if not d)
    assert (train_m.totals.docs_empty + held_m.totals.docs_empty) == empty
    assert (train_m.totals.tokens_in + held_m.totals.tokens_in
            == sum(len(d) for d in docs))


def test_holdout_rerun_is_a_no_op_and_without_holdout_nothing_changes(tmp_path):
    docs = _docs(60)
    src = write_docs(tmp_path / "in" / "a.parquet", docs)
    out = tmp_path / "out"
    args = ["pack", "-q", "-c", 32, "--holdout", 0.3, src, out]
    assert invoke(args).exit_code == 0
    before = read_manifest(tmp_path / "out-holdout")  # the default place: OUTPUT-holdout
    res = invoke(["pack", "-c", 32, "--holdout", 0.3, src, out])
    assert res.exit_code == 0 and "already holds this pack" in res.output
    assert "(already complete)" in res.output
    assert read_manifest(tmp_path / "out-holdout") == before
    plain = tmp_path / "plain"
    assert invoke(["pack", "-q", "-c", 32, src, plain]).exit_code == 0
    m = read_manifest(plain)
    assert "holdout" not in m.options and m.totals.docs_other_split == 0


def test_holdout_errors_are_one_line(tmp_path):
    src = write_docs(tmp_path / "in" / "a.parquet", [[1, 2, 3], [4, 5]])
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--holdout", 0.01, src, out])
    assert res.exit_code == 1 and "holds out no document of the 2" in res.output
    assert not out.exists()
    res = invoke(["pack", "-q", "--holdout", 0.5, "--holdout-output", out, src, out])
    assert res.exit_code == 2 and "overlaps OUTPUT" in res.output
    res = invoke(["pack", "-q", "--holdout", 1.5, src, out])
    assert res.exit_code == 2
    res = invoke(["pack", "-q", "--holdout-output", tmp_path / "v", src, out])
    assert res.exit_code == 2 and "needs --holdout" in res.output


@pytest.mark.parametrize("seed, side", [(0, "training side"), (1, "held-out side")])
def test_a_side_of_only_empty_documents_is_refused_before_either_output_is_written(
        tmp_path, seed, side):
    """Docs [], [1,2,3] with --holdout 0.5: one side gets the empty document alone. Each seed is
    refused in one true line (it said "all 2 documents are empty", and with seed 1 wrote the
    training output before failing on the held-out one); neither output is written."""
    src = write_docs(tmp_path / "in" / "a.parquet", [[], [1, 2, 3]])
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "-c", 4, "--holdout", 0.5, "--seed", seed, src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert f"the {side} gets only empty documents (1, no tokens" in res.output
    assert not out.exists() and not (tmp_path / "out-holdout").exists()


@pytest.mark.parametrize("masked_side, empty_doc, extra", [
    ("held-out side", False, ()), ("held-out side", False, ("--append-eos", "2")),
    ("held-out side", False, ("--workers", "2", "--window-docs", "5")),
    ("training side", False, ()), ("held-out side", True, ()), ("training side", True, ())])
def test_a_side_of_only_masked_documents_is_refused_as_masked_before_either_is_written(
        tmp_path, masked_side, empty_doc, extra):
    """31 documents of 4 tokens, those of one side of --holdout 0.3 (seed 0) with attention
    mask all 0 (and, with ``empty_doc``, one of them empty). That side has no token to pack:
    refused before either output is written, its documents said masked (or masked or empty),
    counted right. It used to write the training output and then fail on the held-out one
    with "all 31 documents ... are empty" (the held-out tokens were counted before the mask),
    and every rerun failed the same way."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    held = holdout_mask(0, 31, 0.3, 0)
    dark = held if masked_side == "held-out side" else ~held  # the side fully masked
    ids = [[5, 6, 7, 8] for _ in range(31)]
    mask = [[0] * 4 if dark[d] else [1] * 4 for d in range(31)]
    first = int(np.flatnonzero(dark)[0])
    if empty_doc:
        ids[first], mask[first] = [], []
    src = tmp_path / "in" / "m.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": ids, "attention_mask": mask}), src)
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "-c", 16, "--holdout", 0.3, *extra, src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    n, m = int(dark.sum()), 31 - int(dark.sum())
    other = f"the {m} left for training" if masked_side == "held-out side" else f"the {m} held out"
    what = (f"only masked or empty documents ({n}: 1 empty, the {4 * (n - 1)} tokens of the "
            f"other {n - 1} all have attention mask 0" if empty_doc else
            f"only masked documents ({n}: their {4 * n} tokens all have attention mask 0")
    assert (f"--holdout 0.3 --seed 0: the {masked_side} gets {what}; the tokens to pack are "
            f"all in {other}); check the attention mask") in res.output, res.output
    assert "are empty" not in res.output
    assert not out.exists() and not (tmp_path / "out-holdout").exists()


@pytest.mark.parametrize("empty_doc", [False, True])
def test_both_sides_masked_are_said_of_the_whole_input(tmp_path, empty_doc):
    """Every document's tokens masked (one empty document among them with ``empty_doc``) with
    --holdout: neither side has a token, and the refusal counts the whole input (31 documents,
    not the training side's 20), says masked, not empty, and writes nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids, mask = [[5, 6, 7, 8]] * 31, [[0] * 4] * 31
    if empty_doc:
        ids, mask = ids[:30] + [[]], mask[:30] + [[]]
    src = tmp_path / "in" / "m.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": ids, "attention_mask": mask}), src)
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "-c", 16, "--holdout", 0.3, src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    what = ("are masked or empty (1 empty; the 120 tokens of the other 30 all have attention "
            "mask 0)" if empty_doc else "are masked (their 124 tokens all have attention mask 0)")
    assert f"no tokens to pack: all 31 documents in column 'input_ids' {what}" in res.output
    assert not out.exists() and not (tmp_path / "out-holdout").exists()


@pytest.mark.parametrize("extra", [(), ("--window-docs", "6"), ("--append-eos", "2"),
                                   ("--workers", "2")])
def test_overflow_error_refuses_a_long_document_on_either_side_before_either_is_written(
        tmp_path, extra):
    """--overflow error with --holdout: a document over C is refused, naming its file and row,
    whichever side holds it, and neither output is written. On the held-out side it used to be
    found only once the training output was finished and published, which stayed without its
    held-out split. A document of exactly C (C - 1 with --append-eos) is no refusal."""
    rng = np.random.default_rng(3)
    fits = 31 if "--append-eos" in extra else 32
    docs = [rng.integers(3, 500, int(rng.integers(1, 12))).tolist() for _ in range(40)]
    docs[5] = [7] * fits
    mask = holdout_mask(0, len(docs), 0.3, 0)  # True: held out
    held, kept = int(np.flatnonzero(mask)[0]), int(np.flatnonzero(~mask)[1])
    assert held != 5 and kept != 5
    for long_doc in (held, kept):
        case = tmp_path / f"doc{long_doc}"
        src = write_docs(case / "in" / "a.parquet",
                         [[9] * 33 if i == long_doc else d for i, d in enumerate(docs)])
        out = case / "out"
        res = invoke(["pack", "-q", "-c", 32, "--overflow", "error", "--holdout", 0.3,
                      "--seed", 0, *extra, src, out])
        assert res.exit_code == 1, res.output
        counted = " (counting what --append-eos adds)" if "--append-eos" in extra else ""
        assert (f"a.parquet: row {long_doc} (0-based): document {long_doc} has "
                f"{33 + (32 - fits)} tokens{counted}, longer than --capacity 32") in res.output
        assert not out.exists() and not (case / "out-holdout").exists()
    src = write_docs(tmp_path / "fits" / "a.parquet", docs)  # exactly C: packed, both sides
    res = invoke(["pack", "-q", "-c", 32, "--overflow", "error", "--holdout", 0.3, "--seed", 0,
                  *extra, src, tmp_path / "fits" / "out"])
    assert res.exit_code == 0, res.output


def test_stats_of_each_side_says_how_many_documents_the_other_side_took(tmp_path):
    """``stats`` of either output of a --holdout pack says the documents read and how many of
    them went to the other output, so that 'in' is not read as this output's own documents."""
    docs = _docs()
    src = write_docs(tmp_path / "in" / "a.parquet", docs)
    out, held = tmp_path / "out", tmp_path / "val"
    assert invoke(["pack", "-q", "-c", 32, "--holdout", 0.25, "--holdout-output", held,
                   src, out]).exit_code == 0
    n_held = int(holdout_mask(0, len(docs), 0.25, 0).sum())
    for path, other in ((out, n_held), (held, len(docs) - n_held)):
        res = invoke(["stats", path])
        assert res.exit_code == 0, res.output
        assert (f"(in: {len(docs):,} read, {other:,} of them, empty ones included, for the "
                "other --holdout output" in res.output), res.output
    plain = tmp_path / "plain"
    assert invoke(["pack", "-q", "-c", 32, src, plain]).exit_code == 0
    assert f"(in: {len(docs):,}, empty skipped" in invoke(["stats", plain]).output


def test_the_split_warning_of_a_holdout_pack_counts_this_outputs_documents(tmp_path):
    """``--overflow split`` warns with the share of this output's non-empty documents it cut,
    not of every document read (the other side's are in neither count)."""
    docs = _docs()
    src = write_docs(tmp_path / "in" / "a.parquet", docs)
    res = invoke(["pack", "-c", 8, "--holdout", 0.25, "--holdout-output", tmp_path / "val",
                  src, tmp_path / "out"])
    assert res.exit_code == 0, res.output
    rule = holdout_mask(0, len(docs), 0.25, 0)
    kept = [d for i, d in enumerate(docs) if d and not rule[i]]
    split = sum(len(d) > 8 for d in kept)
    assert f"({split:,} of {len(kept):,}) into pieces" in res.output, res.output


def _unusable_holdout(kind: str, tmp_path, src):
    """A --holdout-output that cannot be written, of kind ``kind``; returns its path and, for
    ``lock``, the lock held on it (release it after the run)."""
    held = tmp_path / "held"
    if kind == "foreign":
        held.mkdir()
        (held / "notes.txt").write_text("mine")
    elif kind == "file":
        held.write_text("a file")
    elif kind == "in-input":
        held = src.parent / "held"
    elif kind == "other-pack":  # a finished pack of other options, no --overwrite
        assert invoke(["pack", "-q", "-c", 16, src, held]).exit_code == 0
    elif kind == "lock":  # another pack writing it
        from filelock import FileLock

        from packtool.formats.manifest import LOCK_NAME

        held.mkdir()
        lock = FileLock(str(held / LOCK_NAME))
        lock.acquire()
        return held, lock
    return held, None


HOLDOUT_REFUSALS = {"foreign": "packtool did not write", "file": "is a file",
                    "in-input": "overlaps INPUT", "other-pack": "a finished pack of other options",
                    "lock": "another packtool run is writing"}


@pytest.mark.parametrize("kind", list(HOLDOUT_REFUSALS))
def test_an_unusable_holdout_output_is_refused_before_anything_is_written(tmp_path, kind):
    """Every check the held-out output must pass (the ones OUTPUT gets) runs before either
    output is written: a refused --holdout-output leaves no training pack behind (it used to
    leave a finished one, 20 % of the documents short, that stats passed)."""
    src = write_docs(tmp_path / "in" / "a.parquet", _docs(60))
    held, lock = _unusable_holdout(kind, tmp_path, src)
    before = hash_tree(held) if held.is_dir() else None
    out = tmp_path / "out"
    try:
        res = invoke(["pack", "-q", "-c", 64, "--holdout", 0.2, "--holdout-output", held,
                      src.parent, out])
    finally:
        if lock is not None:
            lock.release()
    assert res.exit_code == 1, res.output
    assert res.output.count("\n") == 1 and HOLDOUT_REFUSALS[kind] in res.output, res.output
    # named as the option that gave it, not as the training OUTPUT
    assert "--holdout-output" in res.output and not re.search(r"(?<![-\w])OUTPUT", res.output), \
        res.output
    assert not out.exists()
    if before is not None:
        assert hash_tree(held) == before
    elif kind == "in-input":
        assert not held.exists()
    # a refused OUTPUT writes nothing into a usable held-out output either
    (tmp_path / "bad").write_text("a file")
    res = invoke(["pack", "-q", "-c", 64, "--holdout", 0.2, "--holdout-output",
                  tmp_path / "ok", src, tmp_path / "bad"])
    assert res.exit_code == 1 and "is a file" in res.output, res.output
    assert not (tmp_path / "ok").exists()


def test_the_python_api_checks_the_holdout_output_before_writing(tmp_path):
    """``packtool.pack`` and ``packtool.pack_dataset`` with ``holdout=`` go through the same
    checks: an unusable held-out output raises OutputError and no training pack is left."""
    import packtool
    from packtool.errors import OutputError

    docs = _docs(60)
    src = write_docs(tmp_path / "in" / "a.parquet", docs)
    held, _ = _unusable_holdout("foreign", tmp_path, src)
    with pytest.raises(OutputError, match="packtool did not write"):
        packtool.pack(src, tmp_path / "out", capacity=64, holdout=0.2, holdout_output=held)
    assert not (tmp_path / "out").exists()
    (tmp_path / "ds-holdout").mkdir()  # the default place: OUTPUT-holdout
    (tmp_path / "ds-holdout" / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="packtool did not write"):
        packtool.pack_dataset([{"input_ids": d} for d in docs if d], 64,
                              output=tmp_path / "ds", holdout=0.2)
    assert not (tmp_path / "ds").exists()


def test_ctrl_c_during_the_held_out_pack_names_the_held_out_output(tmp_path, monkeypatch):
    """Ctrl-C once the training output is finished, while the held-out one is packed: the line
    names the held-out output as the one without a manifest and says the training output is
    finished (it used to say OUTPUT had no manifest); the rerun finishes the held-out pack."""
    import packtool.pipeline as pipeline

    src = write_docs(tmp_path / "in" / "a.parquet", _docs(60))
    out, held = tmp_path / "out", tmp_path / "held"
    real = pipeline._pack

    def stop_in_holdout(cfg, *args, **kwargs):
        if cfg.holdout_part == "holdout":
            raise KeyboardInterrupt
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(pipeline, "_pack", stop_in_holdout)
    args = ["pack", "-q", "-c", 64, "--holdout", 0.2, "--holdout-output", held, src.parent, out]
    res = invoke(args)
    assert res.exit_code == 130, res.output
    assert f"interrupted: {out} is finished; {held} has no manifest; nothing was kept " \
        "(--holdout-output is as before the run)" in res.output, res.output
    read_manifest(out)  # the training output is complete
    monkeypatch.undo()
    assert invoke(args).exit_code == 0
    read_manifest(held)


def test_a_resumed_holdout_pack_stopped_before_it_enters_its_outputs_says_what_they_keep(
        tmp_path):
    """``pack --holdout`` stopped while the training pack plans keeps its read part for the
    rerun. That rerun, stopped before it touched either output (the test pause ``start``), said
    "nothing was written"; it now says what each output holds, and the next rerun reuses the
    read part."""
    src = write_docs(tmp_path / "in" / "a.parquet", _docs(60))
    out, held = tmp_path / "out", tmp_path / "held"
    args = ["pack", "-q", "-c", 64, "--holdout", 0.2, "--holdout-output", held, src, out]
    code, err = stopped_at(args, "plan:0")
    assert code == 130, err
    kept = err.split(f"{out} has no manifest; kept for the rerun: ", 1)[1].split(";")[0]
    assert kept.startswith("1 read part ("), err
    code, err = stopped_at(args, "start", signal.SIGTERM)
    assert code == 143, err
    assert err == (f"packtool: terminated (SIGTERM): {out} has no manifest; kept for the rerun: "
                   f"{kept}; nothing was kept ({held} is as it was before the run); rerun the "
                   "same command to resume and finish it\n"), err
    res = invoke([*args[:2], "--json", *args[2:]])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["parts_reused"] == 1


def _doc_ids(out) -> set[int]:
    rows, _ = read_output(out)
    return {int(d) for r in rows for d in r["doc_ids"]}


@pytest.mark.parametrize("named", [True, False], ids=["holdout-output", "derived-name"])
@pytest.mark.parametrize("stop", ["SIGINT", "SIGKILL"])
def test_an_overwrite_stopped_between_its_two_packs_never_pairs_new_and_old_rows(tmp_path,
                                                                                 stop, named):
    """``pack --overwrite --holdout`` over a finished pair of another --seed, stopped once the
    new training output is finished and before the held-out pack begins: the earlier held-out
    pack (which holds documents the new training rows hold) went when the training pack began
    writing, so a reader of the held-out output is told a pack is writing it (after the stop:
    an interrupted pack to rerun), never handed the old rows beside the new ones (it used to
    be). The Ctrl-C line says which output is finished and which is not; the same command
    then finishes the pair as an undisturbed run does; with the held-out output named after
    OUTPUT (no --holdout-output) too, where the line said it was "as it was before the run"."""
    src = write_docs(tmp_path / "in" / "a.parquet", _docs(80))
    out = tmp_path / "out"
    held = tmp_path / "held" if named else tmp_path / "out-holdout"
    base = ["-c", 64, "--rows-per-shard", 2, "--workers", 1, "--holdout", 0.3,
            *(["--holdout-output", held] if named else [])]
    assert invoke(["pack", "-q", *base, "--seed", 1, src, out]).exit_code == 0
    again = [*base, "--seed", 2, "--overwrite"]
    ref, ref_held = tmp_path / "ref", tmp_path / "ref-held"
    assert invoke(["pack", "-q", *base[:8], "--holdout-output", ref_held, "--seed", 2, src,
                   ref]).exit_code == 0
    with paused_pack(src, out, "holdout", again, stop=getattr(signal, stop)) as proc:
        assert hash_pack(out) == hash_pack(ref)  # the new training output is finished
        with pytest.raises(ManifestError, match="a packtool pack is writing it now"):
            read_manifest(held)
    if stop == "SIGINT":
        assert f"Error: interrupted: {out} is finished; {held} has no manifest" in proc.err, \
            proc.err
        assert proc.err.rstrip().endswith("rerun the same command to resume and finish it")
    with pytest.raises(ManifestError, match="an interrupted pack: rerun"):
        read_manifest(held)
    assert invoke(["pack", "-q", *again, src, out]).exit_code == 0
    assert hash_pack(out) == hash_pack(ref) and hash_pack(held) == hash_pack(ref_held)
    assert not _doc_ids(out) & _doc_ids(held)


_SIGNAL_IN_FIRST_MANIFEST = """
import signal, sys
import packtool.output as output
original, calls = output.publish_manifest, []

def then_signal(*args, **kwargs):
    original(*args, **kwargs)
    calls.append(args[0])
    if len(calls) == 1:  # the training manifest: the signal comes as it is written
        signal.raise_signal(signal.{sig})

output.publish_manifest = then_signal
sys.argv = ["packtool", *sys.argv[1:]]
from packtool.__main__ import main
main()
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_while_the_training_manifest_is_written_stops_before_the_held_out_pack(
        tmp_path, sig):
    """SIGTERM (or Ctrl-C) while the training output's manifest is written: held then (the
    training output is complete and is tidied), but honoured before the held-out pack begins
    (it used to be dropped: the held-out pack ran and the command exited 0): exit 143 (130),
    the line says the training output is finished and the held-out one not; the same command
    then finishes the held-out pack."""
    import subprocess
    import sys

    src = write_docs(tmp_path / "in" / "a.parquet", _docs(60))
    out, held = tmp_path / "out", tmp_path / "held"
    args = ["pack", "-q", "-c", 64, "--holdout", 0.2, "--holdout-output", held, src, out]
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_IN_FIRST_MANIFEST.format(sig=sig),
                           *map(str, args)], capture_output=True, text=True, timeout=300)
    word = "terminated (SIGTERM)" if sig == "SIGTERM" else "interrupted"
    assert proc.returncode == 128 + getattr(signal, sig), proc.stderr
    assert proc.stderr.strip() == (f"Error: {word}: {out} is finished; {held} has no manifest; "
                                   "nothing was kept (--holdout-output is as before the run); "
                                   "rerun the same command to resume and finish it")
    assert not held.exists()
    assert {p.name for p in out.iterdir() if p.name.startswith(".")} == {
        ".packtool-manifest.parquet"}  # the training output is tidied: marker, scratch, lock
    read_manifest(out)
    res = invoke(args)
    assert res.exit_code == 0, res.output
    assert not _doc_ids(out) & _doc_ids(held)


@pytest.mark.parametrize("given, want", [
    (".", "../dotout-holdout"), ("./", "../dotout-holdout"), ("..", "../../work-holdout"),
    ("out/", "out-holdout"), ("./x/.", "x-holdout"), ("x/..", "../dotout-holdout"),
    ("x/y/", "x/y-holdout"), ("s3://b/p/out/", "s3://b/p/out-holdout"),
    ("s3://b/p/out///", "s3://b/p/out-holdout"),
    ("s3://b/p/out?endpoint_override=h:9", "s3://b/p/out-holdout?endpoint_override=h:9")])
def test_the_default_holdout_output_is_named_from_the_folder_output_names(
        tmp_path, monkeypatch, given, want):
    """The default --holdout-output is OUTPUT-holdout beside the folder OUTPUT names, whatever
    its spelling: "." inside dotout/ is ../dotout-holdout (it was "-holdout", refused as
    overlapping OUTPUT), a trailing slash, "..", "./x/." and "x/.." alike; a store URI's from
    its key, its options kept (a store key with "." or ".." segments is refused as it is
    parsed: test_cli.py)."""
    from packtool.config import PackConfig

    (tmp_path / "work" / "dotout").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work" / "dotout")
    cfg = PackConfig(inputs=("s3://b/in" if "://" in given else "/in",), output=given,
                     holdout=0.2)
    assert cfg.holdout_output == want


@pytest.mark.parametrize("whole", ["/", "/tmp/..", "s3://b/", "s3://b"])
def test_an_output_with_nothing_beside_it_needs_a_holdout_output(whole):
    """The filesystem root (also spelt /tmp/..) and a whole bucket have no folder beside them:
    the default --holdout-output is refused, naming the option to give."""
    from packtool.config import PackConfig
    from packtool.errors import ConfigError

    with pytest.raises(ConfigError, match="give --holdout-output LOCATION"):
        PackConfig(inputs=("/in",), output=whole, holdout=0.2)


def test_a_pack_into_the_working_folder_holds_out_beside_it(tmp_path, monkeypatch):
    """cd dotout && pack --holdout 0.2 ../in/d.parquet . writes ../dotout-holdout (it was
    refused: "--holdout-output '-holdout': overlaps OUTPUT .")."""
    src = write_docs(tmp_path / "in" / "d.parquet", [[1, 2, 3][:1 + d % 3] for d in range(40)])
    (tmp_path / "dotout").mkdir()
    monkeypatch.chdir(tmp_path / "dotout")
    res = invoke(["pack", "-q", "-c", 16, "--holdout", 0.2, src, "."])
    assert res.exit_code == 0, res.output
    held = read_manifest(tmp_path / "dotout-holdout")
    assert held.options["holdout_part"] == "holdout"
    assert read_manifest(tmp_path / "dotout").totals.docs_other_split == held.totals.docs_in - \
        held.totals.docs_other_split


def _stale_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if "stale held-out output" in ln]


@pytest.mark.parametrize("repack", [
    ["--overwrite"],  # --holdout dropped
    ["--overwrite", "--holdout", 0.4, "--holdout-output", "{other}"],  # another fraction, place
    ["--holdout", 0.3, "--holdout-output", "{other}"],  # the same split, written elsewhere
], ids=["without holdout", "other fraction and place", "other place"])
def test_a_held_out_output_a_repack_no_longer_writes_is_said_stale(tmp_path, repack):
    """pack --holdout, then a repack of OUTPUT that does not write the held-out output again:
    the repack warns in one line naming it and the fix, and stats, export and the loader of
    it warn that it is stale (its documents may be training rows now); the outputs of the new
    pack are not warned of, nor the pair before the repack."""
    from packtool.loader.source import open_source

    src = write_docs(tmp_path / "in" / "a.parquet", _docs(80))
    out, held, other = tmp_path / "q", tmp_path / "q-holdout", tmp_path / "elsewhere"
    assert invoke(["pack", "-q", "-c", 32, "--holdout", 0.3, src, out]).exit_code == 0
    for cmd in (["stats", held], ["export", "--to", "nemo", held, tmp_path / "n0"]):
        res = invoke(cmd)
        assert res.exit_code == 0 and not _stale_lines(res.output), res.output
    args = [str(a).format(other=other) for a in repack]
    res = invoke(["pack", "-q", "-c", 32, *args, src, out])
    assert res.exit_code == 0, res.output
    assert _stale_lines(res.output) == [
        f"WARNING: {held}: stale held-out output: the previous pack of {out} held these "
        "documents out, this pack does not write it, so they may be among the training rows; "
        "remove it"], res.output
    said = (f"{held}: stale held-out output: its training output {out} was packed again "
            "without it")
    res = invoke(["stats", held])
    assert res.exit_code == 0 and len(_stale_lines(res.output)) == 1, res.output
    assert said in res.output
    res = invoke(["export", "--to", "nemo", held, tmp_path / "n1"])
    assert res.exit_code == 0 and said in res.output, res.output
    with pytest.warns(UserWarning, match="stale held-out output"):
        open_source(held, None)[0].close()
    if "--holdout-output" in args:  # the new pair is not stale
        res = invoke(["stats", other])
        assert res.exit_code == 0 and not _stale_lines(res.output), res.output
    res = invoke(["pack", "-q", "-c", 32, *args, src, out])  # a rerun: nothing to say again
    assert res.exit_code == 0 and not _stale_lines(res.output), res.output


def test_outputs_packed_before_pairings_were_recorded_are_read_as_before(tmp_path):
    """A --holdout pair whose manifests carry no holdout_pair (an older packtool): no stale
    warning when read or when OUTPUT is packed again without --holdout, and a rerun of the same
    command is still a no-op; a manifest carrying one reads it back."""
    from packtool.formats.manifest import (HoldoutPairing, MANIFEST_NAME, Manifest,
                                           manifest_bytes, read_manifest_and_schema)

    src = write_docs(tmp_path / "in" / "a.parquet", _docs(60))
    out, held = tmp_path / "q", tmp_path / "q-holdout"
    args = ["pack", "-q", "-c", 32, "--holdout", 0.3, src, out]
    assert invoke(args).exit_code == 0
    m, _ = read_manifest_and_schema(held)
    assert isinstance(m.holdout_pair, HoldoutPairing)
    assert Manifest.from_dict(m.to_dict()) == m
    for o in (out, held):  # as an older packtool wrote them
        m, schema = read_manifest_and_schema(o)
        d = m.to_dict()
        del d["holdout_pair"]
        (o / MANIFEST_NAME).write_bytes(manifest_bytes(Manifest.from_dict(d), schema))
        assert read_manifest(o).holdout_pair is None
    res = invoke(["pack", "-c", 32, "--holdout", 0.3, src, out])
    assert res.exit_code == 0 and "already holds this pack" in res.output, res.output
    assert read_manifest(out).holdout_pair is None
    res = invoke(["stats", held])
    assert res.exit_code == 0 and not _stale_lines(res.output), res.output
    res = invoke(["pack", "-q", "-c", 32, "--overwrite", src, out])
    assert res.exit_code == 0 and not _stale_lines(res.output), res.output
    res = invoke(["stats", held])
    assert res.exit_code == 0 and not _stale_lines(res.output), res.output


def test_a_held_out_output_copied_without_its_training_output_is_not_said_stale(tmp_path):
    """A held-out output copied (or moved) alone: its training output is not there to read,
    which says nothing about staleness, so stats, export and the loader read it without a stale
    warning; a training output that is read and pairs with no held-out output still makes it
    stale."""
    import shutil
    import warnings

    from packtool.loader.source import open_source

    src = write_docs(tmp_path / "in" / "a.parquet", _docs(80))
    out = tmp_path / "q"
    assert invoke(["pack", "-q", "-c", 32, "--holdout", 0.3, src, out]).exit_code == 0
    alone = tmp_path / "other" / "q-holdout"
    shutil.copytree(tmp_path / "q-holdout", alone)
    res = invoke(["stats", alone])
    assert res.exit_code == 0 and "stale" not in res.output and "remove it" not in res.output, \
        res.output
    res = invoke(["export", "--to", "nemo", alone, tmp_path / "n"])
    assert res.exit_code == 0 and "stale" not in res.output, res.output
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_source(alone, None)[0].close()
    (tmp_path / "other" / "q").mkdir()  # a training output there that is no pack: unreadable
    res = invoke(["stats", alone])
    assert res.exit_code == 0 and "stale" not in res.output, res.output
    shutil.rmtree(tmp_path / "other" / "q")
    assert invoke(["pack", "-q", "-c", 32, src, tmp_path / "other" / "q"]).exit_code == 0
    res = invoke(["stats", alone])  # read, and it pairs with no held-out output: stale
    assert res.exit_code == 0 and len(_stale_lines(res.output)) == 1, res.output


def _small_disk(monkeypatch, disk, capacity):
    """The free space packtool sees: ``capacity`` bytes less what the files under ``disk``
    hold, as on a disk of that size."""
    import shutil as sh

    usage = sh.disk_usage

    def free(path):
        used = sum(f.stat().st_size for f in disk.rglob("*") if f.is_file())
        return usage(path)._replace(free=capacity - used)

    monkeypatch.setattr("packtool.output.shutil.disk_usage", free)


def test_the_held_out_pack_asks_for_the_space_of_its_own_documents(tmp_path, monkeypatch):
    """On a disk where the training pack fits and leaves less free than the whole input's
    scratch, the held-out pack (a tenth of the documents) is not refused for the space of the
    whole input: each side's need counts its own documents, and both outputs are finished."""
    from packtool.config import PackConfig
    from packtool.pipeline import _prepare, disk_peak

    rng = np.random.default_rng(4)
    src = write_docs(tmp_path / "in" / "a.parquet",
                     [rng.integers(0, 50_000, int(k)).tolist()
                      for k in rng.integers(100, 900, 1500)])
    args = ["pack", "-q", "-c", 2048, "--rows-per-shard", 64, "--holdout", 0.1, src]
    ref = tmp_path / "ref"
    assert invoke([*args, ref / "out"]).exit_code == 0
    trained = sum(f.stat().st_size for f in (ref / "out").iterdir())
    run = _prepare(PackConfig(inputs=(str(src),), output=str(ref / "x"), capacity=2048,
                              rows_per_shard=64))
    whole, _ = disk_peak(run.cfg, sum(p.tokens for p in run.parts),
                         sum(p.docs for p in run.parts), run.windows.count)
    disk = tmp_path / "disk"
    disk.mkdir()
    _small_disk(monkeypatch, disk, whole + trained // 2)
    res = invoke([*args, disk / "out"])
    assert res.exit_code == 0, res.output
    assert hash_tree(disk / "out") == hash_tree(ref / "out")
    assert hash_tree(disk / "out-holdout") == hash_tree(ref / "out-holdout")


def test_a_refused_held_out_output_named_by_packtool_says_which_destination(tmp_path, s3):
    """Given OUTPUT alone, the held-out output packtool names beside it (OUTPUT-holdout) is
    named in its refusals as the held-out output, with the OUTPUT its name comes from: a
    missing bucket or a file in its place is not blamed on a name the user never typed. One
    the user named with --holdout-output is named as given."""
    _, bucket = s3
    src = write_docs(tmp_path / "in" / "a.parquet", _docs(40))
    nob = f"s3://{bucket}-none/out"
    res = invoke(["pack", "-q", "-c", 16, "--holdout", 0.3, src, nob])
    assert res.exit_code == 1, res.output
    assert res.output.strip().splitlines() == [
        f"Error: {nob}-holdout (the held-out output, named after OUTPUT {nob}): no bucket "
        f"'{bucket}-none' in this store; check the bucket name in the URI and the endpoint"]
    (tmp_path / "out-holdout").write_text("x")
    res = invoke(["pack", "-q", "-c", 16, "--holdout", 0.3, src, tmp_path / "out"])
    assert res.output.strip().splitlines() == [
        f"Error: {tmp_path / 'out-holdout'} (the held-out output, named after OUTPUT "
        f"{tmp_path / 'out'}): exists and is a file; held-out output must be a directory"]
    assert not (tmp_path / "out").exists()
    res = invoke(["pack", "-q", "-c", 16, "--holdout", 0.3, "--holdout-output",
                  f"s3://{bucket}-none/val", src, tmp_path / "out"])
    assert res.output.strip().splitlines() == [
        f"Error: s3://{bucket}-none/val: no bucket '{bucket}-none' in this store; check the "
        "bucket name in the URI and the endpoint"]
