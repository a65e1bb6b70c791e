"""``packtool tokenize``: text (JSON Lines, Parquet) to the tokenized Parquet ``pack`` reads, with
a tokenizer from a local file. ``tokenize`` then ``pack`` equals tokenizing with the same
tokenizer in Python then packing; bad input stops with one line naming the file and the line or
row; an interrupted run resumes from its finished shards."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import (DENIED_TEXT, DOWN_TEXT, faulty_store, finished_shards, hash_store_tree,
                       hash_tree, invoke, one_store_line,
                       read_output, signals_after_run, stopped_at)
from packtool.formats.manifest import IN_PROGRESS_NAME, MANIFEST_NAME, read_manifest

tokenizers = pytest.importorskip("tokenizers")

TEXTS = ["Hello world, packing documents.", "", "def f(x):\n    return x + 1\n",
         "naïve café — ünïcödé ✓ 漢字", "</s> is text here, not a control token",
         "a" * 300, "short", "line one\nline two\n\nline four"] * 7


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    """A small byte-level BPE trained here (no download): a real tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 3, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def write_jsonl(path, texts, key="text"):
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({key: t, "id": i}, ensure_ascii=False) + "\n")
    return path


def python_then_pack(tmp_path, ids, capacity, *flags):
    src = tmp_path / "py" / "docs.parquet"
    src.parent.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32()))}), src)
    assert invoke(["pack", "-q", "-c", capacity, *flags, src, tmp_path / "py-out"]).exit_code == 0
    return read_output(tmp_path / "py-out")[0]


def test_tokenize_then_pack_equals_python_tokenization_then_pack(tmp_path, hf_tokenizer):
    """Two inputs (JSON Lines and Parquet, in a directory) tokenized with --append-eos, then
    packed, give the rows of the same tokenizer's encode_batch in Python, EOS appended, packed."""
    d = tmp_path / "text"
    d.mkdir()
    write_jsonl(d / "a.jsonl", TEXTS[:30])
    pq.write_table(pa.table({"body": TEXTS[30:]}), d / "b.parquet", row_group_size=5)
    out = tmp_path / "packed"
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--append-eos", "</s>",
                  "--rows-per-shard", 8, "--batch-docs", 3, d / "a.jsonl", tmp_path / "tok-a"])
    assert res.exit_code == 0, res.output
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--append-eos", "</s>",
                  "--text-column", "body", "--rows-per-shard", 8, "--batch-docs", 3,
                  d / "b.parquet", tmp_path / "tok-b"])
    assert res.exit_code == 0, res.output
    assert invoke(["pack", "-q", "-c", 48, tmp_path / "tok-a", tmp_path / "tok-b", out]
                  ).exit_code == 0
    tok = tokenizers.Tokenizer.from_file(str(hf_tokenizer))
    tok.encode_special_tokens = True  # "</s>" written in a text is text
    eos = tok.token_to_id("</s>")
    ids = [e.ids + ([eos] if e.ids and e.ids[-1] != eos else [])
           for e in tok.encode_batch(TEXTS, add_special_tokens=False)]
    assert all(eos not in x[:-1] for x in ids)
    assert python_then_pack(tmp_path, ids, 48) == read_output(out)[0]
    m = read_manifest(tmp_path / "tok-a")
    assert m.kind == "tokenized" and m.totals.docs_in == 30
    assert m.totals.tokens_in == sum(len(x) for x in ids[:30])
    assert [s.rows for s in m.shards] == [8, 8, 8, 6]
    assert m.options["tokenizer"]["sha256"] and m.options["append_eos"] == eos


def test_special_token_text_in_a_document_is_text_never_a_control_id(tmp_path, hf_tokenizer):
    """A document that writes "</s>" (a page about tokenizers) keeps those characters as text
    ids: the EOS id comes only from --append-eos (so it is appended, not taken as already
    there) and from the tokenizer's own template with --add-special-tokens (never twice)."""
    from tokenizers import processors

    tok = tokenizers.Tokenizer.from_file(str(hf_tokenizer))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    texts = ["hello </s>", "<s> a </s> b", "</s>"]
    src = write_jsonl(tmp_path / "t.jsonl", texts)
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--append-eos", "</s>", src,
                  tmp_path / "a"])
    assert res.exit_code == 0, res.output
    got = pq.read_table(tmp_path / "a").column("input_ids").to_pylist()
    for text, ids in zip(texts, got):
        assert ids[-1] == eos and bos not in ids and eos not in ids[:-1], (text, ids)
        assert tok.decode(ids[:-1], skip_special_tokens=False) == text
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    templ = tmp_path / "templ.json"
    tok.save(str(templ))
    res = invoke(["tokenize", "-q", "--tokenizer", templ, "--add-special-tokens",
                  "--append-eos", "</s>", src, tmp_path / "b"])
    assert res.exit_code == 0, res.output
    for ids in pq.read_table(tmp_path / "b").column("input_ids").to_pylist():
        assert ids[0] == bos and ids[-1] == eos and ids.count(eos) == 1 and ids.count(bos) == 1
    # an empty text stays empty with the template too (as --append-eos adds nothing to it)
    src = write_jsonl(tmp_path / "e.jsonl", ["", "x"])
    assert invoke(["tokenize", "-q", "--tokenizer", templ, "--add-special-tokens", src,
                   tmp_path / "c"]).exit_code == 0
    got = pq.read_table(tmp_path / "c").column("input_ids").to_pylist()
    assert got[0] == [] and got[1][0] == bos and got[1][-1] == eos


def tiny_ranks():
    """Byte-level BPE ranks: the 256 bytes, then a few merges."""
    ranks = {bytes([b]): b for b in range(256)}
    for merged in (b"he", b"ll", b"hell", b"hello", b" w", b"or", b"ld", b"in", b"th", b"the"):
        ranks[merged] = len(ranks)
    return ranks


def test_tekken_and_tiktoken_files_are_read_without_a_download(tmp_path):
    """A Tekken JSON (ids = rank + special tokens, '</s>' from its list) and a tiktoken BPE file
    named after cl100k_base (its regex and special tokens, the file's ranks) tokenize, then pack,
    as tiktoken does in Python."""
    import tiktoken

    ranks = tiny_ranks()
    n_special = 10
    pattern = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+"
    tekken = {"config": {"pattern": pattern, "default_vocab_size": len(ranks) + n_special,
                         "default_num_special_tokens": n_special},
              "vocab": [{"rank": r, "token_bytes": base64.b64encode(b).decode()}
                        for b, r in sorted(ranks.items(), key=lambda kv: kv[1])],
              "special_tokens": [{"rank": 0, "token_str": "<unk>"}, {"rank": 1, "token_str": "<s>"},
                                 {"rank": 2, "token_str": "</s>"}]}
    (tmp_path / "tekken_test.json").write_text(json.dumps(tekken))
    with open(tmp_path / "cl100k_base.tiktoken", "w") as f:
        for b, r in ranks.items():
            f.write(f"{base64.b64encode(b).decode()} {r}\n")
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:16])
    enc = tiktoken.Encoding("t", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    want = [[t + n_special for t in x] for x in enc.encode_ordinary_batch(TEXTS[:16])]
    want = [x + [2] if x else x for x in want]
    res = invoke(["tokenize", "-q", "--tokenizer", tmp_path / "tekken_test.json",
                  "--append-eos", "</s>", src, tmp_path / "tk"])
    assert res.exit_code == 0, res.output
    got = [r["input_ids"] for r in pq.read_table(tmp_path / "tk").to_pylist()]
    assert got == want

    from tiktoken_ext import openai_public

    real = openai_public.load_tiktoken_bpe
    res = invoke(["tokenize", "-q", "--tokenizer", tmp_path / "cl100k_base.tiktoken",
                  "--append-eos", "<|endoftext|>", src, tmp_path / "tt"])
    assert res.exit_code == 0, res.output
    assert openai_public.load_tiktoken_bpe is real  # put back after use
    got = [r["input_ids"] for r in pq.read_table(tmp_path / "tt").to_pylist()]
    assert got[0][-1] == 100257 and len(got) == 16
    res = invoke(["tokenize", "-q", "--tokenizer", tmp_path / "cl100k_base.tiktoken",
                  "--append-eos", "<|nope|>", src, tmp_path / "tt2"])
    assert res.exit_code == 2 and "not a special token" in res.output
    # a Tekken file without a list of special tokens (v3, tekken_240911.json): the id is asked
    del tekken["special_tokens"]
    (tmp_path / "tekken_v3.json").write_text(json.dumps(tekken))
    res = invoke(["tokenize", "-q", "--tokenizer", tmp_path / "tekken_v3.json",
                  "--append-eos", "</s>", src, tmp_path / "tk3"])
    assert res.exit_code == 2 and "names no special tokens" in res.output, res.output
    assert "</s> is 2" in res.output


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory, hf_tokenizer):
    """One small file of each kind tokenize reads, with its vocabulary size: the tokenizers
    JSON, a Tekken JSON (10 special ids, then the ranks) and a BPE file named after cl100k_base
    (its special tokens reach id 100276)."""
    d = tmp_path_factory.mktemp("kinds")
    ranks = tiny_ranks()
    tekken = {"config": {"pattern": r"\p{L}+|\s+|.", "default_vocab_size": len(ranks) + 10,
                         "default_num_special_tokens": 10},
              "vocab": [{"rank": r, "token_bytes": base64.b64encode(b).decode()}
                        for b, r in sorted(ranks.items(), key=lambda kv: kv[1])]}
    (d / "tekken_t.json").write_text(json.dumps(tekken))
    with open(d / "cl100k_base.tiktoken", "w") as f:
        for b, r in ranks.items():
            f.write(f"{base64.b64encode(b).decode()} {r}\n")
    size = tokenizers.Tokenizer.from_file(str(hf_tokenizer)).get_vocab_size(with_added_tokens=True)
    return {"tokenizers": (hf_tokenizer, size), "tekken": (d / "tekken_t.json", len(ranks) + 10),
            "tiktoken": (d / "cl100k_base.tiktoken", 100277)}


@pytest.mark.parametrize("kind", ["tokenizers", "tekken", "tiktoken"])
def test_a_boundary_id_outside_the_vocabulary_is_refused(tmp_path, tokenizer_files, kind):
    """--append-eos / --prepend-bos of an id the tokenizer does not have (its vocabulary size,
    say: Tekken's 131072) would fail at the model's embedding lookup: one line naming the
    option, the id and the vocabulary size, exit 2, nothing written; the last id is taken."""
    path, size = tokenizer_files[kind]
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:4])
    for option in ("--append-eos", "--prepend-bos"):
        res = invoke(["tokenize", "-q", "--tokenizer", path, option, size, src, tmp_path / "o"])
        assert res.exit_code == 2, res.output
        [line] = res.output.strip().splitlines()
        assert line.startswith(f"Error: {option} {size}: id {size} is outside the vocabulary")
        assert f"{size:,} ids: 0..{size - 1}" in line, line
        assert not (tmp_path / "o").exists()
    res = invoke(["tokenize", "-q", "--tokenizer", path, "--append-eos", size - 1, src,
                  tmp_path / "o"])
    assert res.exit_code == 0, res.output
    got = pq.read_table(tmp_path / "o").column("input_ids").to_pylist()
    assert all(ids[-1] == size - 1 for ids in got if ids)


def test_an_invalid_tokenizer_pattern_is_one_line_naming_the_option(tmp_path, tokenizer_files):
    """A --tokenizer-pattern the regex engine cannot parse: the option, the pattern and the
    engine's error in one line, exit 2 (it was an internal error)."""
    path, _ = tokenizer_files["tiktoken"]
    other = tmp_path / "other.tiktoken"  # a BPE file of no known name takes the option
    other.write_bytes(path.read_bytes())
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:4])
    res = invoke(["tokenize", "-q", "--tokenizer", other, "--tokenizer-pattern", "([unclosed",
                  src, tmp_path / "o"])
    assert res.exit_code == 2, res.output
    [line] = res.output.strip().splitlines()
    assert line.startswith("Error: --tokenizer-pattern '([unclosed': not a valid regex ("), line
    assert "internal error" not in line and not (tmp_path / "o").exists()


def test_a_rerun_with_other_options_and_a_column_kept_twice_are_told_plainly(tmp_path,
                                                                            hf_tokenizer):
    """A finished tokenize output rerun with other options is named a tokenize run (not a
    pack), with the option that differs; --keep-column given twice says so."""
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:4])
    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, src, tmp_path / "o"]
    assert invoke(args).exit_code == 0
    res = invoke(args[:4] + ["--append-eos", "</s>"] + args[4:])
    assert res.exit_code == 1, res.output
    assert res.output.strip() == (f"Error: {tmp_path / 'o'}: OUTPUT holds a finished tokenize run "
                                  "of other options (--append-eos none -> 1); pass --overwrite to "
                                  "replace it or choose another location")
    # a repeatable option and a flag as the command line spells them
    res = invoke(args[:4] + ["--keep-column", "id", "--add-special-tokens"] + args[4:])
    assert res.exit_code == 1 and ("of other options (--keep-column none -> id, "
                                   "--add-special-tokens not given -> given);") in res.output, \
        res.output
    res = invoke(args[:4] + ["--keep-column", "id", "--keep-column", "id", src, tmp_path / "k"])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == "Error: --keep-column 'id': given 2 times; give each column once"


def test_bad_text_input_gets_one_line_naming_file_and_line(tmp_path, hf_tokenizer):
    def run(*args):
        res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, *args])
        assert res.exit_code == 1, res.output
        line = res.output.strip()
        assert line.startswith("Error: ") and len(line.splitlines()) == 1, res.output
        return line

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n\n{"text": "also fine"}\n{"text": "broken"\n{"text": "x"}\n')
    line = run(bad, tmp_path / "o1")
    assert f"{bad}: line 4: not valid JSON" in line
    assert not (tmp_path / "o1").exists()  # nothing published, a new OUTPUT removed
    nokey = write_jsonl(tmp_path / "nokey.jsonl", ["a", "b"], key="content")
    line = run(nokey, tmp_path / "o2")
    assert f"{nokey}: line 1: no key 'text' (keys: content, id); pass --text-column NAME" in line
    notobj = tmp_path / "list.jsonl"
    notobj.write_text('["text"]\n')
    assert "line 1: a JSON array, not an object" in run(notobj, tmp_path / "o3")
    nulls = tmp_path / "null.jsonl"
    nulls.write_text('{"text": "a"}\n{"text": null}\n')
    assert "line 2: 'text' is null, not a string" in run(nulls, tmp_path / "o4")
    pq.write_table(pa.table({"body": ["a", None]}), tmp_path / "n.parquet")
    line = run(tmp_path / "n.parquet", tmp_path / "o5", "--text-column", "body")
    assert "n.parquet: row 1 (0-based): 'body' is null" in line
    line = run(tmp_path / "n.parquet", tmp_path / "o6")
    assert "n.parquet: no column 'text'; available columns: body; pass --text-column" in line
    pq.write_table(pa.table({"text": [[1, 2]]}), tmp_path / "ids.parquet")
    assert "has type list<element: int64>, expected text" in run(tmp_path / "ids.parquet",
                                                              tmp_path / "o7")
    assert "no such tokenizer file" in invoke(
        ["tokenize", "-q", "--tokenizer", tmp_path / "none.json", bad, tmp_path / "o8"]).output
    # half a surrogate pair (a JSON \u escape can write one; it is no text): named with its
    # line for every tokenizer, in a kept column too; a whole pair is an ordinary character
    sur = tmp_path / "sur.jsonl"
    sur.write_text('{"text": "a \\ud83d\\ude00 b"}\n{"text": "a \\ud800 b"}\n')
    assert f"{sur}: line 2: 'text' holds a lone surrogate (\\ud800)" in run(sur, tmp_path / "s1")
    kept = tmp_path / "kept.jsonl"
    kept.write_text('{"text": "a", "src": "\\uDC00"}\n')
    assert "line 1: 'src' holds a lone surrogate (\\udc00)" in run(
        "--keep-column", "src", kept, tmp_path / "s2")
    assert not (tmp_path / "s1").exists() and not (tmp_path / "s2").exists()
    # no documents at all (an empty file, blank lines only): refused as pack refuses them
    empty, blank = tmp_path / "empty.jsonl", tmp_path / "blank.jsonl"
    empty.write_text("")
    blank.write_text("\n  \n\n")
    for src, out in ((empty, "o9"), (blank, "o10")):
        assert f"{src}: no text to tokenize: no documents (empty files or blank lines " \
               "only); check the INPUT and --text-column" in run(src, tmp_path / out)
        assert not (tmp_path / out).exists()
    # refused into OUTPUT x/y/z: none of the folders it created is left (not z alone)
    assert "no text to tokenize" in run(empty, tmp_path / "x" / "y" / "z")
    assert not (tmp_path / "x").exists()


def test_interrupted_tokenize_resumes_from_its_finished_shards(tmp_path, hf_tokenizer):
    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    out = tmp_path / "out"
    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, "--rows-per-shard", 10, src, out]
    assert invoke(args).exit_code == 0
    whole = hash_tree(out)
    fp = read_manifest(out).fingerprint
    # what a run killed after three shards leaves: those shards and the in-progress marker
    (out / MANIFEST_NAME).unlink()
    for p in sorted(out.glob("part-*.parquet"))[3:]:
        p.unlink()
    (out / IN_PROGRESS_NAME).write_text(json.dumps({"fingerprint": fp}))
    res = invoke(["tokenize", "--json", "--tokenizer", hf_tokenizer, "--rows-per-shard", 10,
                  src, out])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["shards_reused"] == 3
    assert hash_tree(out) == whole
    again = invoke(["tokenize", "--tokenizer", hf_tokenizer, "--rows-per-shard", 10, src, out])
    assert "already holds this tokenization" in again.output
    quiet = invoke(args)  # -q: nothing on success (it printed "nothing to do")
    assert quiet.exit_code == 0 and quiet.output == "", quiet.output


def test_a_resumed_tokenize_counts_bos_and_eos_as_a_whole_run_does(tmp_path, hf_tokenizer):
    """A killed run's marker may not list its last shards: with --append-eos their EOS counts
    are known only from it, so such shards are written again (the same bytes) and the totals
    equal a whole run's."""
    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    out = tmp_path / "out"
    args = ["tokenize", "--tokenizer", hf_tokenizer, "--append-eos", "</s>", "--rows-per-shard",
            10, src, out]
    assert invoke(["--debug", *args[:1], "-q", *args[1:]]).exit_code == 0
    whole, m = hash_tree(out), read_manifest(out)
    nonempty = sum(1 for t in TEXTS if t)
    assert m.totals.docs_eos_added + m.totals.docs_eos_present == nonempty
    assert m.totals.docs_eos_added > 0
    (out / MANIFEST_NAME).unlink()
    for p in sorted(out.glob("part-*.parquet"))[3:]:
        p.unlink()
    (out / IN_PROGRESS_NAME).write_text(json.dumps({"fingerprint": m.fingerprint}))
    res = invoke([*args[:1], "--json", *args[1:]])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["shards_reused"] == 0
    assert hash_tree(out) == whole and read_manifest(out).totals == m.totals


def _stop_publishing_at(monkeypatch, n: int):
    """Make tokenize's n-th shard publication raise KeyboardInterrupt (Ctrl-C there); returns
    the real publish_shard, to put back."""
    from packtool.text import run

    real, calls = run.publish_shard, []

    def stop(*a):
        calls.append(a)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*a)

    monkeypatch.setattr(run, "publish_shard", stop)
    return real


def test_an_interrupted_tokenize_keeps_its_shards_and_their_counts(tmp_path, hf_tokenizer,
                                                                  monkeypatch):
    """Ctrl-C after three shards: the marker lists them with their counts, so the rerun keeps
    them (BOS/EOS counts included) and ends with a whole run's bytes and totals."""
    import packtool.text.run as run

    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, "--append-eos", "</s>",
            "--prepend-bos", "<s>", "--rows-per-shard", 10, src]
    assert invoke([*args, tmp_path / "whole"]).exit_code == 0
    whole = read_manifest(tmp_path / "whole")
    real = _stop_publishing_at(monkeypatch, 4)
    out = tmp_path / "out"
    assert invoke([*args, out]).exit_code == 130
    marker = json.loads((out / IN_PROGRESS_NAME).read_text())
    assert sorted(marker["shards"]) == [f"part-00000-0000{k}.parquet" for k in range(3)]
    monkeypatch.setattr(run, "publish_shard", real)
    res = invoke(["tokenize", "--json", *args[2:], out])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["shards_reused"] == 3
    assert hash_tree(out) == hash_tree(tmp_path / "whole")
    assert read_manifest(out).totals == whole.totals and whole.totals.docs_bos_added > 0


def test_an_interrupted_tokenize_output_is_called_a_tokenize_run_by_every_command(
        tmp_path, hf_tokenizer, monkeypatch):
    """Ctrl-C after two shards: pack and compare (as INPUT), stats, verify, export and the
    reader say an interrupted tokenize run, to be finished by rerunning that tokenize and then
    packed; they used to call it an interrupted pack (rerun packtool pack) or a pack's packed
    rows. OUTPUT inside it is inside a tokenized output."""
    from packtool.errors import ManifestError
    from packtool.formats.packed import PackedOutput
    from packtool.text import run

    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, "--rows-per-shard", 10, src]
    real = _stop_publishing_at(monkeypatch, 3)
    lk = tmp_path / "lk"
    assert invoke([*args, lk]).exit_code == 130
    monkeypatch.setattr(run, "publish_shard", real)
    assert json.loads((lk / IN_PROGRESS_NAME).read_text())["kind"] == "tokenized"
    as_input = (f"Error: {lk}: an interrupted packtool tokenize run ({IN_PROGRESS_NAME}, no "
                f"{MANIFEST_NAME} yet), so not all of its documents are written; rerun the same "
                "packtool tokenize command to finish it, then pack it")
    for cmd in (["pack", "-c", 64, lk, tmp_path / "x"], ["compare", "-c", 64, lk]):
        res = invoke(cmd)
        assert res.exit_code == 1 and res.output.strip() == as_input, (cmd, res.output)
    for cmd, hint in [
            (["stats", lk], f"packtool compare {lk} --capacity C"),
            (["verify", lk], f"packtool pack --capacity C {lk} OUTPUT, then packtool verify "
                             "OUTPUT"),
            (["export", "--to", "nemo", lk, tmp_path / "nemo"],
             f"packtool pack --capacity C {lk} OUTPUT, then packtool export --to nemo OUTPUT "
             "DEST")]:
        res = invoke(cmd)
        assert res.exit_code == 1 and res.output.strip() == (
            f"Error: {lk}: an interrupted packtool tokenize run (no {MANIFEST_NAME} yet): "
            "tokenized documents, not a packed output; rerun the same packtool tokenize "
            f"command to finish it, then run: {hint}"), (cmd, res.output)
    with pytest.raises(ManifestError, match="an interrupted packtool tokenize run .* rerun the "
                       "same packtool tokenize command to finish it, then pack it"):
        PackedOutput.open(lk)
    res = invoke([*args, lk / "sub"])
    assert res.exit_code == 1 and "OUTPUT is inside the tokenized output" in res.output
    assert invoke([*args, lk]).exit_code == 0  # what every message says to do
    assert invoke(["pack", "-q", "-c", 64, lk, tmp_path / "x"]).exit_code == 0


@pytest.mark.parametrize("shard", [0, 2])
def test_a_running_tokenize_is_named_to_the_commands_it_holds_off(tmp_path, hf_tokenizer,
                                                                 shard):
    """While a tokenize holds OUTPUT (paused before shard 0: no marker yet, or before shard
    2: its marker written), the same tokenize started again is told another tokenize run
    writes there, as is one with other options once the marker says so; pack and stats are
    told a tokenize run is writing it. They all used to say a pack."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    out = tmp_path / "out"
    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, "--rows-per-shard", 10, src, out]
    env = dict(os.environ, PACKTOOL_TEST_PAUSE_AT=f"tokenize-shard:{shard}")
    proc = subprocess.Popen([sys.executable, "-m", "packtool", *map(str, args)],
                            stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        assert f"test pause at tokenize-shard:{shard}" in proc.stderr.readline()
        res = invoke(args)
        assert res.exit_code == 1 and res.output.strip() == (
            f"Error: {out}: another packtool tokenize run is writing this OUTPUT (lock "
            ".packtool.lock is held); wait for it to end or choose another OUTPUT"), res.output
        other = invoke([*args[:-4], "--rows-per-shard", 11, src, out])
        assert other.exit_code == 1
        assert ("another packtool tokenize run is writing" if shard else
                "another packtool run is writing") in other.output, other.output
        res = invoke(["stats", out])
        assert res.exit_code == 1, res.output
        if shard:
            assert res.output.strip() == (
                f"Error: {out}: a packtool tokenize run is writing it now (its lock is held): "
                "tokenized documents, not packed rows; wait for that tokenize run to end, then "
                f"pack it: packtool pack --capacity C {out} OUTPUT"), res.output
            res = invoke(["pack", "-c", 64, out, tmp_path / "x"])
            assert res.exit_code == 1 and res.output.strip() == (
                f"Error: {out}: a packtool tokenize run is writing it now (its lock is held), so "
                "not all of its documents are written yet; wait for that tokenize run to end, "
                "then pack it"), res.output
        else:  # nothing written yet names what writes it
            assert "a packtool run is writing it now" in res.output, res.output
        assert "packtool pack is" not in res.output + other.output
    finally:
        watchdog.cancel()
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait()
        proc.stderr.close()


def test_a_tokenized_output_is_pack_input_but_not_packed_rows(tmp_path, hf_tokenizer):
    src = write_jsonl(tmp_path / "a.jsonl", TEXTS[:10])
    out = tmp_path / "tok"
    assert invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, src, out]).exit_code == 0
    res = invoke(["pack", "-c", 64, out, tmp_path / "packed"])
    assert res.exit_code == 0 and "INPUT: skipped" not in res.output  # the manifest is no skip
    res = invoke(["stats", out])
    assert res.exit_code == 1 and "a packtool tokenized output" in res.output
    assert "pack it first" in res.output
    res = invoke(["stats", "-c", 64, "--compare", out])  # its documents, dry run (deprecated)
    assert res.exit_code == 0, res.output
    res = invoke(["compare", out, "-c", 64])  # the dry run's own command
    assert res.exit_code == 0, res.output
    res = invoke(["verify", "--data-only", out])
    assert res.exit_code == 1 and "pack it first" in res.output
    res = invoke(["export", "--to", "nemo", out, tmp_path / "nemo"])
    assert res.exit_code == 1 and "a packtool tokenized output" in res.output
    m = read_manifest(out)  # the typed manifest: documents, no capacity or labels fact
    assert m.kind == "tokenized" and not m.is_packed and m.labels is None
    stored = [r["input_ids"] for r in pq.read_table(out).to_pylist()]
    assert m.totals.docs_in == len(stored) == 10
    assert m.totals.tokens_in == sum(map(len, stored)) > 0
    from packtool.errors import ManifestError
    from packtool.formats.packed import PackedOutput

    with pytest.raises(ManifestError, match="a packtool tokenized output .*pack it first"):
        PackedOutput.open(out)


def _damage(tok, how):
    """Damage the tokenized output ``tok`` (5 shards) as ``how`` says; returns the path a
    refusal must name and what it must say."""
    import dataclasses
    import shutil

    from packtool.formats.manifest import publish_manifest, read_manifest_and_schema

    shard = tok / "part-00000-00002.parquet"
    m, schema = read_manifest_and_schema(tok)
    if how == "missing":
        shard.unlink()
        return shard, (f"listed in the manifest of the tokenized output {tok} (12 documents) "
                       "but missing; restore the file, or rerun the same packtool tokenize "
                       "command")
    if how == "truncated":
        shard.write_bytes(shard.read_bytes()[:-100])
        return shard, "the shard was changed or truncated; restore the file, or rerun"
    if how == "rewritten":  # same size, other bytes: what a rewrite in place leaves
        shards = [dataclasses.replace(s, footer_sha256="0" * 64) if s.file == shard.name else s
                  for s in m.shards]
        publish_manifest(tok, m.replace_shards(shards), schema)
        return shard, "its Parquet footer differs from the manifest of the tokenized output"
    if how == "copy":
        shutil.copy(shard, tok / "part-00000-00002-copy.parquet")
        return tok, ("its manifest does not list (part-00000-00002-copy.parquet): a copy of "
                     "a shard would be packed twice, and anything else is not that output's; "
                     f"move it out of {tok}")
    if how == "folder":
        (tok / "more").mkdir()
        shutil.copy(shard, tok / "more" / "extra.parquet")
        return tok, "its manifest does not list (more/)"
    assert how == "totals"
    publish_manifest(tok, dataclasses.replace(
        m, totals=dataclasses.replace(m.totals, docs_in=m.totals.docs_in - 1)), schema)
    return tok, "the shards its manifest lists hold 56 documents, its totals say 55"


@pytest.mark.parametrize("how", ["missing", "truncated", "rewritten", "copy", "folder",
                                 "totals"])
def test_pack_and_compare_read_exactly_the_shards_a_tokenized_manifest_lists(
        tmp_path, hf_tokenizer, how):
    """A finished tokenize output given as INPUT is read as its manifest lists it: a shard
    missing, truncated or rewritten (its footer), a stray copy or folder beside the shards, or
    counts that disagree are refused in one line naming the file and the fix, before anything
    is written, by pack (--skip-unsupported too), compare and packtool.pack. They used to pack
    what was there: documents lost, or packed twice, with exit 0."""
    import packtool
    from packtool.errors import InputError

    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    tok = tmp_path / "tok"
    assert invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--rows-per-shard", 12, src,
                   tok]).exit_code == 0
    assert len(list(tok.glob("part-*.parquet"))) == 5
    where, said = _damage(tok, how)
    for args in (["pack", "-q", "-c", 64, tok, tmp_path / "p"],
                 ["pack", "-q", "-c", 64, "--skip-unsupported", tok, tmp_path / "p"],
                 ["compare", "-c", 64, tok]):
        res = invoke(args)
        assert res.exit_code == 1, (args, res.output)
        [line] = res.output.strip().splitlines()
        assert line.startswith(f"Error: {where}: ") and said in line, line
    with pytest.raises(InputError, match=re.escape(said)):
        packtool.pack(tok, tmp_path / "p", capacity=64)
    assert not (tmp_path / "p").exists()


def _rewrite_manifest(out, edit) -> None:
    """Rewrite OUTPUT's manifest JSON through ``edit(dict)`` (as an older packtool, or a hand,
    wrote it), both of its copies."""
    from packtool.formats.manifest import MANIFEST_META_KEY

    schema = pq.read_schema(out / MANIFEST_NAME)
    m = json.loads(schema.metadata[MANIFEST_META_KEY])
    edit(m)
    meta = {**schema.metadata, MANIFEST_META_KEY: json.dumps(m).encode()}
    pq.write_table(schema.with_metadata(meta).empty_table(), out / MANIFEST_NAME)


def _as_version_3(strip: bool):
    def edit(m):
        m["format_version"] = 3
        for s in m["shards"] if strip else ():  # what the manifest may lack: read back
            s.pop("footer_sha256", None)
            s.pop("row_groups", None)
    return edit


@pytest.mark.parametrize("strip", [False, True], ids=["indexed", "unindexed"])
def test_upgrade_brings_a_tokenized_output_of_format_version_3_to_this_version(
        tmp_path, hf_tokenizer, strip):
    """Tokenize outputs existed at format version 3; version 4 changed only what the totals'
    tokens_dropped counts (0 in a tokenized output), so upgrade rewrites such a manifest as
    this version's, shards untouched, once every shard's sha256 and footer agree with it (it
    refused: "a packtool tokenized output ...; pack it first"). A rerun of the same tokenize
    finds the tokenization there and says the manifest is an older version's and how to
    upgrade it. A manifest whose rows contradict its shards is refused, unchanged."""
    from packtool.formats.manifest import FORMAT_VERSION

    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    out = tmp_path / "tok"
    args = ["tokenize", "--tokenizer", hf_tokenizer, "--append-eos", "</s>", "--rows-per-shard",
            10, src, out]
    assert invoke(args).exit_code == 0
    whole, m = hash_tree(out), read_manifest(out)
    _rewrite_manifest(out, _as_version_3(strip))
    assert read_manifest(out).format_version == 3
    res = invoke(args)
    assert res.exit_code == 0 and res.output.strip() == (
        f"{out}: already holds this tokenization (its manifest is format version 3: packtool "
        f"upgrade {out} rewrites it as version {FORMAT_VERSION}); nothing to do"), res.output
    res = invoke(["upgrade", out])
    assert res.exit_code == 0 and res.output.strip() == (
        f"{out}: manifest rewritten as format version {FORMAT_VERSION}; shards unchanged"), \
        res.output
    assert read_manifest(out) == m and hash_tree(out) == whole
    assert invoke(args).output.strip() == f"{out}: already holds this tokenization; nothing to do"
    res = invoke(["upgrade", out])
    assert res.exit_code == 0 and "nothing to do" in res.output, res.output
    for edit, said in ((lambda d: d["shards"][1].update(rows=3),
                        f"{out / m.shards[1].file}: its Parquet footer holds 10 documents, the "
                        "manifest says 3"),
                       (lambda d: d["totals"].update(docs_in=5),
                        f"{out}: its shards hold {m.totals.docs_in:,} documents, its totals "
                        "say 5")):
        _rewrite_manifest(out, lambda d: (_as_version_3(strip)(d), edit(d)))
        before = (out / MANIFEST_NAME).read_bytes()
        res = invoke(["upgrade", out])
        assert res.exit_code == 1 and said in res.output and "tokenize" in res.output, \
            res.output
        assert "pack it first" not in res.output, res.output
        assert (out / MANIFEST_NAME).read_bytes() == before
        _rewrite_manifest(out, lambda d: d.update(m.to_dict()))


def test_a_tokenized_output_packs_every_document_its_manifest_counts(tmp_path, hf_tokenizer):
    """The shards of a tokenized output are packed whole, in its manifest's order; what else
    its folder holds is reported as in any folder: documentation and hidden entries always, a
    file of another format with --skip-unsupported (refused without it)."""
    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    tok = tmp_path / "tok"
    assert invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--rows-per-shard", 12, src,
                   tok]).exit_code == 0
    (tok / "README.md").write_text("what this is")
    (tok / "_SUCCESS").write_text("")
    (tok / "notes.csv").write_text("a,b")
    res = invoke(["pack", "-q", "-c", 64, tok, tmp_path / "p"])
    assert res.exit_code == 1 and "notes.csv" in res.output and "--skip-unsupported" in res.output
    res = invoke(["pack", "--json", "-c", 64, "--no-shuffle", "--skip-unsupported", tok,
                  tmp_path / "p"])
    assert res.exit_code == 0, res.output
    assert sorted(json.loads(res.stdout)["inputs_not_read"]) == [
        f"{tok / n} ({why})" for n, why in [("README.md", "documentation"),
                                            ("_SUCCESS", "hidden or '_'-prefixed"),
                                            ("notes.csv", "unsupported format")]]
    packed = read_manifest(tmp_path / "p")
    assert packed.totals.docs_in == read_manifest(tok).totals.docs_in == len(TEXTS)
    assert [Path(i.path).name for i in packed.inputs] == [
        s.file for s in read_manifest(tok).shards]


def test_tokenize_and_pack_into_each_others_output_are_refused_not_replaced(tmp_path,
                                                                           hf_tokenizer):
    """tokenize pointed at a pack's OUTPUT (finished or interrupted), and pack at a tokenize
    run's, is told the directory holds the other command's output, never asked to pass
    --overwrite as if it were a rerun with other options; nothing there is touched."""
    src = write_jsonl(tmp_path / "a.jsonl", TEXTS[:6])
    tok, packed = tmp_path / "tok", tmp_path / "packed"
    assert invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, src, tok]).exit_code == 0
    assert invoke(["pack", "-q", "-c", 64, tok, packed]).exit_code == 0
    before = hash_tree(packed), hash_tree(tok)
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, src, packed])
    assert res.exit_code == 1, res.output
    assert res.output.strip() == (
        f"Error: {packed}: OUTPUT holds a finished pack (packed rows), not tokenized "
        "documents; choose another location (--overwrite would delete that pack)")
    tok2 = tmp_path / "tok2"
    assert invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, src, tok2]).exit_code == 0
    res = invoke(["pack", "-q", "-c", 64, tok, tok2])
    assert res.exit_code == 1 and "OUTPUT holds a finished tokenize run (tokenized " \
        "documents), not packed rows" in res.output, res.output
    assert (hash_tree(packed), hash_tree(tok)) == before
    # an interrupted pack: its marker says what it was
    (packed / MANIFEST_NAME).rename(tmp_path / "m")
    (packed / IN_PROGRESS_NAME).write_text(json.dumps({"fingerprint": "x", "options": {},
                                                         "kind": "packed"}))
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, src, packed])
    assert res.exit_code == 1 and "holds an interrupted pack (packed rows)" in res.output
    assert any(p.name.startswith("part-") for p in packed.iterdir())


def test_invalid_utf8_and_dictionary_text_columns(tmp_path, hf_tokenizer):
    """Bytes that are not UTF-8 in an Arrow string column (Parquet or Arrow IPC): one line
    naming the file and the row, never an internal error; a dictionary-encoded text column
    (a pandas Categorical) is its texts, tokenized as the plain column is."""
    bad = pa.array([b"ok", b"fine", b"caf\xe9"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"text": bad}), tmp_path / "b.parquet")
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as f:
        with pa.ipc.new_file(f, pa.schema([("text", pa.string())])) as w:
            w.write_table(pa.table({"text": bad}))
    for name in ("b.parquet", "b.arrow"):
        res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, tmp_path / name,
                      f"{tmp_path}/o-{name}/"])
        assert res.exit_code == 1, res.output
        line = res.output.strip()
        assert len(line.splitlines()) == 1 and "internal error" not in line, line
        assert f"{tmp_path / name}: row 2 (0-based): 'text' is not valid UTF-8" in line, line
        assert not (tmp_path / f"o-{name}").exists()
    texts = TEXTS[:9]
    pq.write_table(pa.table({"text": pa.array(texts).dictionary_encode()}), tmp_path / "d.parquet")
    pq.write_table(pa.table({"text": texts}), tmp_path / "p.parquet")
    for name in ("d", "p"):
        res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, tmp_path / f"{name}.parquet",
                      tmp_path / f"t-{name}"])
        assert res.exit_code == 0, res.output
    assert pq.read_table(tmp_path / "t-d").column("input_ids").to_pylist() == \
        pq.read_table(tmp_path / "t-p").column("input_ids").to_pylist()


def test_tokenize_reads_and_writes_a_store(tmp_path, hf_tokenizer, s3):
    """JSON Lines in a bucket to tokenized shards in a bucket, then pack from the bucket."""
    fs, bucket = s3
    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    fs.create_dir(f"{bucket}/raw")
    with fs.open_output_stream(f"{bucket}/raw/a.jsonl") as f:
        f.write(src.read_bytes())
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--rows-per-shard", 20,
                  f"s3://{bucket}/raw/", f"s3://{bucket}/tok"])
    assert res.exit_code == 0, res.output
    assert invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, src, tmp_path / "local"]
                  ).exit_code == 0
    assert invoke(["pack", "-q", "-c", 64, f"s3://{bucket}/tok", tmp_path / "p1"]).exit_code == 0
    assert invoke(["pack", "-q", "-c", 64, tmp_path / "local", tmp_path / "p2"]).exit_code == 0
    assert read_output(tmp_path / "p1")[0] == read_output(tmp_path / "p2")[0]
    # the bucket's tokenized output is read as its manifest lists it, as a folder's is
    fs.delete_file(f"{bucket}/tok/part-00000-00001.parquet")
    res = invoke(["pack", "-q", "-c", 64, f"s3://{bucket}/tok", tmp_path / "p3"])
    assert res.exit_code == 1 and res.output.startswith(
        f"Error: s3://{bucket}/tok/part-00000-00001.parquet: listed in the manifest of the "
        f"tokenized output s3://{bucket}/tok (20 documents) but missing"), res.output
    # and an unfinished one as a tokenize run, never as a pack
    fs.delete_file(f"{bucket}/tok/{MANIFEST_NAME}")
    with fs.open_output_stream(f"{bucket}/tok/{IN_PROGRESS_NAME}") as f:
        f.write(json.dumps({"fingerprint": "x", "kind": "tokenized"}).encode())
    # a marker and no lock object: a run that stopped (a run releases its lock last)
    res = invoke(["pack", "-q", "-c", 64, f"s3://{bucket}/tok", tmp_path / "p3"])
    assert res.exit_code == 1 and f"s3://{bucket}/tok: an interrupted packtool tokenize run" \
        in res.output, res.output
    res = invoke(["stats", f"s3://{bucket}/tok"])
    assert res.exit_code == 1 and f"s3://{bucket}/tok: an interrupted packtool tokenize run" \
        in res.output, res.output
    # a lock object of another host, which cannot be asked: running or interrupted
    with fs.open_output_stream(f"{bucket}/tok/.packtool.lock") as f:
        f.write(json.dumps({"run": "r", "host": "elsewhere", "pid": 7,
                            "kind": "tokenized"}).encode())
    res = invoke(["pack", "-q", "-c", 64, f"s3://{bucket}/tok", tmp_path / "p3"])
    assert res.exit_code == 1 and f"s3://{bucket}/tok: an unfinished (interrupted or running) " \
        "packtool tokenize run" in res.output and "host elsewhere" in res.output, res.output
    res = invoke(["stats", f"s3://{bucket}/tok"])
    assert res.exit_code == 1 and f"s3://{bucket}/tok: a packtool tokenize run is writing it " \
        "now or was interrupted" in res.output, res.output


@pytest.mark.parametrize("text", [DENIED_TEXT, DOWN_TEXT], ids=["denied", "down"])
@pytest.mark.parametrize("fault", ["head", "body"])
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_store_failing_to_read_a_text_input_is_named_not_the_file(tmp_path, hf_tokenizer, s3,
                                                                    monkeypatch, fault, text,
                                                                    fmt):
    """Text in a store that refuses its objects (HEAD or GET answered 403) or goes down while
    tokenize reads them: the store's one line naming the object, as pack gives it, never
    "damaged or truncated"; no OUTPUT left behind."""
    fs, bucket = s3
    bucket = f"{bucket}/{fmt}-{fault}-{'down' if text == DOWN_TEXT else 'denied'}"  # one each
    texts = [f"document {i}: " + "word " * (i % 50) for i in range(12_000)]  # over 1 MiB
    if fmt == "jsonl":
        with fs.open_output_stream(f"{bucket}/raw/a.jsonl") as f:
            f.write(write_jsonl(tmp_path / "a.jsonl", texts).read_bytes())
    else:
        pq.write_table(pa.table({"text": texts}), f"{bucket}/raw/a.parquet", filesystem=fs,
                       row_group_size=3000)
    faulty_store(monkeypatch, fault, text)
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, f"s3://{bucket}/raw/",
                  tmp_path / "tok"])
    one_store_line(res, f"s3://{bucket}/raw/a.{fmt}", text)
    assert not (tmp_path / "tok").exists()


@pytest.mark.parametrize("text", [DENIED_TEXT, DOWN_TEXT], ids=["denied", "down"])
def test_a_store_failing_to_read_a_tokenized_shard_is_named_not_the_shard(tmp_path, hf_tokenizer,
                                                                         s3, monkeypatch, text):
    """A finished tokenize output in a store, packed while the store refuses its shards or has
    gone (their footers, checked against the manifest): the store's one line naming the
    shard, not "not the shard the manifest lists"."""
    fs, bucket = s3
    bucket = f"{bucket}/{'down' if text == DOWN_TEXT else 'denied'}"  # one each
    with fs.open_output_stream(f"{bucket}/raw/a.jsonl") as f:
        f.write(write_jsonl(tmp_path / "a.jsonl", TEXTS).read_bytes())
    assert invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, f"s3://{bucket}/raw/",
                   f"s3://{bucket}/tok"]).exit_code == 0
    shard = f"s3://{bucket}/tok/{read_manifest(f's3://{bucket}/tok').shards[0].file}"
    faulty_store(monkeypatch, "footer", text)
    res = invoke(["pack", "-q", "-c", 64, f"s3://{bucket}/tok", tmp_path / "out"])
    one_store_line(res, shard, text)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("names,extra,column", [
    (["text", "text"], [], "text"),
    (["text", "source", "source"], ["--keep-column", "source"], "source"),
], ids=["text-column", "kept-column"])
def test_a_column_read_twice_is_refused_in_one_line(tmp_path, hf_tokenizer, names, extra,
                                                    column):
    """A text or kept column a file holds twice is ambiguous: one line naming the file, the
    column and the fix, nothing written (it was an internal KeyError)."""
    texts = pa.array(["a b", "c"])
    pq.write_table(pa.Table.from_arrays([texts] * len(names), names=names), tmp_path / "d.parquet")
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, *extra, tmp_path / "d.parquet",
                  tmp_path / "out"])
    assert res.exit_code == 1, res.output
    assert res.output.strip() == (f"Error: {tmp_path / 'd.parquet'}: column {column!r} appears "
                                  f"{names.count(column)} times; rename or drop one")
    assert not (tmp_path / "out").exists()


def test_kept_columns_travel_beside_input_ids_into_pack(tmp_path, hf_tokenizer):
    """--keep-column carries columns from the text into the tokenized shards, row for row
    (Parquet: their own type; JSON Lines: as text), across shards and a resume, so that
    ``pack --source-column`` works on text tokenized by packtool; a kept column that is not
    there is refused in one line naming the file, and the text column cannot be kept."""
    n = len(TEXTS)
    sources = [("web", "code", "books")[i % 3] for i in range(n)]
    pq.write_table(pa.table({"text": TEXTS, "source": sources,
                             "doc": pa.array(range(n), pa.int64())}),
                   tmp_path / "t.parquet", row_group_size=7)
    with open(tmp_path / "t.jsonl", "w", encoding="utf-8") as f:
        for i, t in enumerate(TEXTS):
            row = {"text": t, "source": sources[i], "doc": i}
            if i == 3:
                del row["source"]
            f.write(json.dumps(row) + "\n")
    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "source",
            "--keep-column", "doc", "--rows-per-shard", 10, "--batch-docs", 4]
    tok = tokenizers.Tokenizer.from_file(str(hf_tokenizer))
    tok.encode_special_tokens = True
    ids = [e.ids for e in tok.encode_batch(TEXTS, add_special_tokens=False)]
    for name, doc_type, docs, srcs in (
            ("t.parquet", pa.int64(), list(range(n)), sources),
            ("t.jsonl", pa.string(), [str(i) for i in range(n)],
             [None if i == 3 else s for i, s in enumerate(sources)])):
        out = tmp_path / f"tok-{name}-out"
        assert invoke(args + [tmp_path / name, out]).exit_code == 0
        t = pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("part-*.parquet")))
        assert t.column_names == ["input_ids", "source", "doc"]
        assert t.schema.field("doc").type == doc_type
        assert t.column("input_ids").to_pylist() == ids
        assert t.column("source").to_pylist() == srcs
        assert t.column("doc").to_pylist() == docs
        # a run killed after two shards resumes to the same bytes
        whole, fp = hash_tree(out), read_manifest(out).fingerprint
        (out / MANIFEST_NAME).unlink()
        for p in sorted(out.glob("part-*.parquet"))[2:]:
            p.unlink()
        (out / IN_PROGRESS_NAME).write_text(json.dumps({"fingerprint": fp}))
        assert invoke(args + [tmp_path / name, out]).exit_code == 0
        assert hash_tree(out) == whole
    packed = tmp_path / "packed"
    res = invoke(["pack", "-q", "-c", 64, "--source-column", "source",
                  tmp_path / "tok-t.parquet-out", packed])
    assert res.exit_code == 0, res.output
    assert read_manifest(packed).source_values == ("books", "code", "web")

    for name in ("t.parquet", "t.jsonl"):  # a typo: refused, Parquet at once, JSON Lines at
        res = invoke(args[:-4] + ["--keep-column", "url", tmp_path / name,  # the file's end
                                  tmp_path / f"x-{name}-out"])
        assert res.exit_code == 1 and name in res.output and "'url'" in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
        assert not (tmp_path / f"x-{name}-out" / MANIFEST_NAME).exists()
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "text",
                  tmp_path / "t.parquet", tmp_path / "y"])
    assert res.exit_code == 2 and "--keep-column 'text'" in res.output, res.output


@pytest.fixture(scope="module")
def two_text_files(tmp_path_factory):
    """56 documents of JSON Lines and 30 of Parquet in row groups of 8 (reader batches end
    there), and the manifest and file hashes of an undisturbed tokenize of them."""
    d = tmp_path_factory.mktemp("resume")
    src = d / "in"
    src.mkdir()
    write_jsonl(src / "a.jsonl", TEXTS)
    pq.write_table(pa.table({"text": (TEXTS * 2)[3:33]}), src / "b.parquet", row_group_size=8)
    return src


RESUME_OPTIONS = ["--workers", 2, "--batch-docs", 7, "--rows-per-shard", 10, "--append-eos",
                  "</s>"]


@pytest.mark.parametrize("shard", [0, 1, 3, 7])
def test_a_tokenize_stopped_at_any_shard_resumes_to_the_bytes_of_an_undisturbed_run(
        tmp_path, hf_tokenizer, two_text_files, shard):
    """SIGTERM before shard 0, 1, 3 or 7 (the second file's second) is written: exit 143 with
    one line saying what OUTPUT holds (nothing before the first shard: no OUTPUT at all), and
    the same command rerun writes every file with the sha256 of an undisturbed run (row groups
    never follow where a run or the reader's batches began)."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, *RESUME_OPTIONS, two_text_files]
    assert invoke([*args, tmp_path / "whole"]).exit_code == 0
    out = tmp_path / "out"
    env = dict(os.environ, PACKTOOL_TEST_PAUSE_AT=f"tokenize-shard:{shard}")
    proc = subprocess.Popen([sys.executable, "-m", "packtool", *map(str, args), str(out)],
                            stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        assert f"test pause at tokenize-shard:{shard}" in proc.stderr.readline()
        os.kill(proc.pid, signal.SIGTERM)
        code, err = proc.wait(), proc.stderr.read()
    finally:
        watchdog.cancel()
        proc.kill()
        proc.stderr.close()
    assert code == 143, err
    [line] = err.strip().splitlines()
    if shard == 0:
        assert line == (f"Error: terminated (SIGTERM): nothing was written ({out} is as it was "
                        "before the run); rerun the same command to tokenize"), line
        assert not out.exists()
    else:
        assert line == (f"Error: terminated (SIGTERM): {out} has no manifest; kept for the rerun:"
                        f" {shard} finished shard{'s' * (shard != 1)}; rerun the same command to "
                        "resume and finish it"), line
        assert len(finished_shards(out)) == shard
    res = invoke([*args, out])
    assert res.exit_code == 0, res.output
    assert hash_tree(out) == hash_tree(tmp_path / "whole")


def test_a_resumed_tokenize_stopped_before_it_enters_output_says_what_output_keeps(
        tmp_path, hf_tokenizer, two_text_files, monkeypatch):
    """A tokenize stopped before shard 3 keeps 3 finished shards. Its rerun stopped before it
    touched OUTPUT (the test pause ``start``: the tokenizer loading, the input listed) said
    "nothing was written", and stopped while it took OUTPUT said "nothing was written (OUTPUT
    is as it was before the run); rerun the same command to tokenize", while the shards were
    there and the next rerun reused them. Both now say what OUTPUT keeps."""
    import signal

    import packtool.output as output

    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, *RESUME_OPTIONS, two_text_files]
    out = tmp_path / "out"
    assert stopped_at([*args, out], "tokenize-shard:3", signal.SIGTERM)[0] == 143
    held = f"{out} has no manifest; kept for the rerun: 3 finished shards"
    code, err = stopped_at([*args, out], "start")
    assert code == 130, err
    assert err == (f"packtool: interrupted: {held}; rerun the same command to resume and finish "
                   "it\n"), err

    def ctrl_c(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(output.LocalOutput, "_lock", ctrl_c)
    res = invoke([*args, out])
    assert res.exit_code == 130, res.output
    assert res.output.strip() == (f"Error: interrupted: {held}; rerun the same command to "
                                  "resume and finish it"), res.output
    monkeypatch.undo()
    res = invoke(["tokenize", "--json", *args[2:], out])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["shards_reused"] == 3


@pytest.mark.parametrize("change,said", [
    (["--batch-docs", 8], "--batch-docs 7 -> 8"),
    (["--rows-per-shard", 11], "--rows-per-shard 10 -> 11"),
    (["--add-special-tokens"], "--add-special-tokens not given -> given"),
])
def test_a_rerun_with_other_options_says_it_replaces_the_interrupted_tokenize(
        tmp_path, hf_tokenizer, two_text_files, change, said):
    """A tokenize stopped after 3 shards, rerun with other options (--batch-docs sets the row
    groups, so it decides the shards' bytes too): the kept shards are not this run's, so every
    shard is written again, to the bytes of a fresh run of those options, and the run says so
    on stderr, once, naming the options that differ, as pack does. It exited 0 with
    shards_reused 0 and said nothing."""
    import os
    import signal
    import subprocess
    import sys

    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, *RESUME_OPTIONS, two_text_files]
    out = tmp_path / "out"
    assert stopped_at([*args, out], "tokenize-shard:3", signal.SIGTERM)[0] == 143
    other = ["tokenize", "--json", "--tokenizer", hf_tokenizer, *RESUME_OPTIONS, *change,
             two_text_files]
    res = subprocess.run([sys.executable, "-m", "packtool", *map(str, other), str(out)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ,
                              "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert res.returncode == 0, res.stderr
    note = (f"OUTPUT held an interrupted tokenize run of other options ({said}) (3 finished "
            "shards): replaced by this tokenize run")
    assert [line for line in res.stderr.splitlines() if "WARNING" in line] == \
        [f"WARNING: {note}"], res.stderr
    summary = json.loads(res.stdout)
    assert summary["shards_reused"] == 0 and summary["warnings"] == [note], summary
    assert invoke([*other, tmp_path / "fresh"]).exit_code == 0
    assert hash_tree(out) == hash_tree(tmp_path / "fresh")


@pytest.mark.parametrize("sig,code,word", [(2, 130, "interrupted"),
                                            (15, 143, "terminated (SIGTERM)")])
def test_a_rerun_with_other_options_stopped_before_its_first_shard_says_whose_shards_stay(
        tmp_path, hf_tokenizer, two_text_files, sig, code, word):
    """A tokenize stopped after 3 shards, rerun with --batch-docs 8 and stopped before its own
    first shard: the 3 shards of the first run are still there, untouched, and the same
    command would replace them, not resume them. It said "kept for the rerun: 3 finished
    shards; rerun the same command to resume and finish it"; it says whose shards they are
    and what each command does with them, and the first command still resumes them."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, *RESUME_OPTIONS, two_text_files]
    out = tmp_path / "out"
    assert stopped_at([*args, out], "tokenize-shard:3", signal.SIGTERM)[0] == 143
    other = [*args[:-1], "--batch-docs", 8, two_text_files, out]
    env = dict(os.environ, PACKTOOL_TEST_PAUSE_AT="tokenize-shard:0")
    proc = subprocess.Popen([sys.executable, "-m", "packtool", *map(str, other)],
                            stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:  # the warning that this run replaces the first run's shards comes before the pause
        said = [proc.stderr.readline(), proc.stderr.readline()]
        assert said[0].startswith("WARNING: OUTPUT held an interrupted tokenize run of other "
                                  "options (--batch-docs 7 -> 8)"), said
        assert "test pause at tokenize-shard:0" in said[1], said
        os.kill(proc.pid, sig)
        got, err = proc.wait(), proc.stderr.read()
    finally:
        watchdog.cancel()
        proc.kill()
        proc.stderr.close()
    assert got == code, err
    assert err.strip().splitlines()[-1] == (
        f"Error: {word}: {out} still holds an interrupted tokenize run of other options "
        "(--batch-docs 7 -> 8) (3 finished shards), untouched; rerun the command of those "
        "options to resume it, or this one to replace it"), err
    assert len(finished_shards(out)) == 3
    res = invoke(["tokenize", "--json", *args[2:], out])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["shards_reused"] == 3


def test_a_shards_row_groups_hold_batch_docs_documents_from_its_first(tmp_path, hf_tokenizer,
                                                                      two_text_files):
    """Row groups are a function of the shard's rows alone: batch_docs documents from its first
    one, the last shorter, whatever the input's batches."""
    out = tmp_path / "out"
    assert invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, *RESUME_OPTIONS,
                   two_text_files, out]).exit_code == 0
    shards = sorted(out.glob("part-*.parquet"))
    assert len(shards) == 9
    for p in shards:
        md = pq.ParquetFile(p).metadata
        rows = md.num_rows
        assert [md.row_group(g).num_rows for g in range(md.num_row_groups)] == \
            [7] * (rows // 7) + ([rows % 7] if rows % 7 else []), p.name


@pytest.mark.parametrize("count", [1, 2])
def test_ctrl_c_after_a_finished_tokenize_or_pack_never_says_nothing_was_written(
        tmp_path, hf_tokenizer, count):
    """Ctrl-C once the run has finished, while the command prints its summary: the output is
    complete, so the command exits 0 with its summary (a second Ctrl-C ends it at once, saying
    the output is complete). It used to print "interrupted; nothing was written" and exit 130
    (tokenize; pack too, in the same window), the start-up handler's words."""
    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    runs = [("packtool.text.run", "run_tokenize",
             ["tokenize", "--tokenizer", str(hf_tokenizer), str(src), str(tmp_path / "tok")],
             "tokenized"),
            ("packtool.pipeline", "run_pack",
             ["pack", "-c", "64", str(tmp_path / "tok"), str(tmp_path / "out")], "packed")]
    for module, fn, args, said in runs:
        proc = signals_after_run(module, fn, count, args)
        assert "nothing was written" not in proc.stderr, proc.stderr
        if count == 1:
            assert proc.returncode == 0, proc.stderr
            assert said in proc.stdout + proc.stderr, (proc.stdout, proc.stderr)
        else:
            assert proc.returncode == 130, proc.stderr
            assert "its output is complete" in proc.stderr, proc.stderr
        assert (Path(args[-1]) / MANIFEST_NAME).is_file()


def test_a_tokenizer_json_s_own_padding_and_truncation_are_not_applied(tmp_path, hf_tokenizer):
    """A tokenizer.json saved with padding (a batch's documents padded to its longest, an empty
    text turned into pad ids) or truncation (documents cut at max_length) encodes each
    document whole and alone: the ids of the same file without those settings, whatever
    --batch-docs is."""
    plain = tokenizers.Tokenizer.from_file(str(hf_tokenizer))
    plain.encode_special_tokens = True  # as tokenize encodes: '</s>' in a text is text
    want = [e.ids for e in plain.encode_batch(TEXTS[:16], add_special_tokens=False)]
    assert max(map(len, want)) > 8 and min(map(len, want)) == 0
    padded = tokenizers.Tokenizer.from_file(str(hf_tokenizer))
    padded.enable_padding(pad_id=0, pad_token="<s>")
    padded.save(str(tmp_path / "padded.json"))
    cut = tokenizers.Tokenizer.from_file(str(hf_tokenizer))
    cut.enable_truncation(max_length=4)
    cut.save(str(tmp_path / "cut.json"))
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:16])
    for name in ("padded.json", "cut.json"):
        for batch in ("5", "16"):
            out = tmp_path / f"o-{name}-{batch}"
            res = invoke(["tokenize", "-q", "--tokenizer", tmp_path / name, "--batch-docs",
                          batch, src, out])
            assert res.exit_code == 0, res.output
            assert pq.read_table(out).column("input_ids").to_pylist() == want, (name, batch)


def test_ids_above_the_ranks_of_a_bpe_file_without_named_special_tokens(tmp_path,
                                                                       tokenizer_files):
    """A BPE file read with --tokenizer-pattern (Llama 3's tokenizer.model) lists no special
    tokens, and they sit above its ranks (<|end_of_text|> is 128001 over 128,000 ranks): the id
    is taken; a name is refused asking for the id; an id no int32 holds, a negative one and a
    number in other digits ('²', which str.isdigit takes) are one-line usage errors."""
    path, _ = tokenizer_files["tiktoken"]
    model = tmp_path / "tokenizer.model"
    model.write_bytes(path.read_bytes())
    n_ranks = len(tiny_ranks())
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:8])
    pat = ["--tokenizer-pattern", r"\p{L}+|\s+|."]
    res = invoke(["tokenize", "-q", "--tokenizer", model, *pat, "--append-eos", n_ranks + 1000,
                  "--prepend-bos", n_ranks, src, tmp_path / "o"])
    assert res.exit_code == 0, res.output
    got = pq.read_table(tmp_path / "o").column("input_ids").to_pylist()
    assert all(x[0] == n_ranks and x[-1] == n_ranks + 1000 for x in got if x)
    assert all(0 <= t < n_ranks for x in got for t in x[1:-1])
    res = invoke(["tokenize", "-q", "--tokenizer", model, *pat, "--append-eos",
                  "<|end_of_text|>", src, tmp_path / "o2"])
    assert res.exit_code == 2 and "names no special tokens; give the token's id" in res.output
    for bad, words in ((2**31, "outside the vocabulary"), (-1, "outside the vocabulary"),
                       ("²", "names no special tokens")):
        res = invoke(["tokenize", "-q", "--tokenizer", model, *pat, "--append-eos", bad, src,
                      tmp_path / "o3"])
        assert res.exit_code == 2, res.output
        [line] = res.output.strip().splitlines()
        assert words in line and "internal error" not in line, line
    for kind in ("tokenizers", "tekken"):  # a number in other digits, with named specials
        res = invoke(["tokenize", "-q", "--tokenizer", tokenizer_files[kind][0],
                      "--append-eos", "²", src, tmp_path / "o4"])
        assert res.exit_code == 2 and "internal error" not in res.output, res.output
    assert not (tmp_path / "o3").exists() and not (tmp_path / "o4").exists()


def test_a_tokenizer_json_beginning_with_white_space_is_read_as_json(tmp_path, hf_tokenizer):
    """A tokenizer.json that begins with a newline or spaces (the tokenizers library reads it)
    is a tokenizers JSON, not a tiktoken BPE file."""
    spaced = tmp_path / "spaced.json"
    spaced.write_bytes(b"\n  \n" + hf_tokenizer.read_bytes())
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:8])
    for tok, out in ((hf_tokenizer, "a"), (spaced, "b")):
        res = invoke(["tokenize", "-q", "--tokenizer", tok, src, tmp_path / out])
        assert res.exit_code == 0, res.output
    assert (pq.read_table(tmp_path / "a").column("input_ids").to_pylist()
            == pq.read_table(tmp_path / "b").column("input_ids").to_pylist())


def test_kept_columns_of_different_types_in_different_files(tmp_path, hf_tokenizer):
    """A kept column int16 in one file and int64 (70000) in the next is written as int64 in
    every shard, values intact (it was refused at the second file naming neither it nor a row);
    int64 in one file and string in another have no common type: one line naming the file,
    exit 1, OUTPUT not made."""
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"text": TEXTS[:4], "n": pa.array([1, 2, 3, 4], pa.int16())}),
                   d / "a.parquet")
    pq.write_table(pa.table({"text": TEXTS[4:8], "n": pa.array([70000, 5, 6, 7], pa.int64())}),
                   d / "b.parquet")
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "n", d,
                  tmp_path / "o"])
    assert res.exit_code == 0, res.output
    t = pq.read_table(tmp_path / "o")
    assert t.schema.field("n").type == pa.int64()
    assert t.column("n").to_pylist() == [1, 2, 3, 4, 70000, 5, 6, 7]
    pq.write_table(pa.table({"text": TEXTS[4:8], "n": ["x", "y", "z", "w"]}), d / "b.parquet")
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "n", d,
                  tmp_path / "o2"])
    assert res.exit_code == 1, res.output
    [line] = res.output.strip().splitlines()
    assert "b.parquet: kept column 'n' is string here and int16 in" in line, line
    assert not (tmp_path / "o2").exists()


def test_a_truncated_compressed_jsonl_is_named_near_where_it_breaks(tmp_path, hf_tokenizer):
    """A .jsonl.gz cut halfway: the message names the lines read before the damage (it said
    'line 1' for a file cut after about half of its lines), exit 1."""
    import gzip
    import os

    rng_text = [f"{i} " + os.urandom(64).hex() for i in range(60_000)]
    raw = "".join(json.dumps({"text": t}) + "\n" for t in rng_text).encode()
    data = gzip.compress(raw, compresslevel=1)
    (tmp_path / "t.jsonl.gz").write_bytes(data[:len(data) // 2])
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, tmp_path / "t.jsonl.gz",
                  tmp_path / "o"])
    assert res.exit_code == 1, res.output
    [line] = res.output.strip().splitlines()
    import re

    m = re.search(r"cannot be read after line ([0-9,]+) ", line)
    assert m, line
    read = int(m.group(1).replace(",", ""))
    assert 10_000 < read < 30_000, line  # the cut is near line 30,000, within one 1 MiB block


def test_every_tokenizer_file_refused_names_the_file_to_give(tmp_path, hf_tokenizer):
    """A JSON that is no tokenizer ends with the fix, as every other tokenizer error does; the
    configs saved beside a tokenizer (tokenizer_config.json, config.json, ...) are named as
    such, with the tokenizer.json beside them when there is one."""
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:4])

    def refusal(tokenizer):
        res = invoke(["tokenize", "-q", "--tokenizer", tokenizer, src, tmp_path / "o"])
        assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
        assert not (tmp_path / "o").exists()
        return res.output.strip()

    (tmp_path / "weird.json").write_text('{"version": 1}')
    assert refusal(tmp_path / "weird.json").endswith(
        "; give a tokenizer.json, a Tekken JSON or a tiktoken BPE file")
    model = tmp_path / "model"
    model.mkdir()
    for name in ("tokenizer_config.json", "config.json", "special_tokens_map.json"):
        (tmp_path / name).write_text('{"model_max_length": 512}')
        said = refusal(tmp_path / name)
        assert said.startswith(f"Error: {tmp_path / name}: is the tokenizer's config") \
            and "give the tokenizer.json saved with it" in said, said
        (model / name).write_text('{"model_max_length": 512}')
    (model / "tokenizer.json").write_bytes(hf_tokenizer.read_bytes())
    said = refusal(model / "tokenizer_config.json")
    assert said.endswith(f"give the tokenizer.json beside it: --tokenizer {model}/tokenizer.json")


def test_a_folder_holding_one_tokenizer_file_is_read_as_that_file(tmp_path, hf_tokenizer,
                                                                   tokenizer_files):
    """--tokenizer FOLDER reads the tokenizer.json or tekken.json it holds (where
    from_pretrained and mistral-common look); a folder with both, or with neither, is refused
    naming what to give (it was "no such tokenizer file")."""
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:16])

    def ids(tokenizer, out):
        res = invoke(["tokenize", "-q", "--tokenizer", tokenizer, src, tmp_path / out])
        assert res.exit_code == 0, res.output
        return [r["input_ids"] for r in pq.read_table(tmp_path / out).to_pylist()]

    hf = tmp_path / "hf-model"
    hf.mkdir()
    (hf / "tokenizer.json").write_bytes(hf_tokenizer.read_bytes())
    (hf / "tokenizer_config.json").write_text("{}")
    (hf / "config.json").write_text("{}")
    assert ids(hf, "a") == ids(hf_tokenizer, "b")
    assert read_manifest(tmp_path / "a").to_dict() == read_manifest(tmp_path / "b").to_dict()
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    (mistral / "tekken.json").write_bytes(tokenizer_files["tekken"][0].read_bytes())
    assert ids(mistral, "c") == ids(tokenizer_files["tekken"][0], "d")

    def refusal(folder):
        res = invoke(["tokenize", "-q", "--tokenizer", folder, src, tmp_path / "o"])
        assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
        assert "no such tokenizer file" not in res.output
        return res.output.strip()

    (hf / "tekken.json").write_bytes((mistral / "tekken.json").read_bytes())
    assert refusal(hf) == (f"Error: {hf}: is a folder holding both tokenizer.json and "
                           f"tekken.json; give one of them: --tokenizer {hf}/tokenizer.json")
    other = tmp_path / "other"
    other.mkdir()
    assert refusal(other) == (f"Error: {other}: is a folder with no tokenizer.json or "
                              "tekken.json; give the tokenizer file itself (a tokenizer.json, a "
                              "Tekken JSON or a tiktoken BPE file)")
    (other / "cl100k_base.tiktoken").write_bytes(tokenizer_files["tiktoken"][0].read_bytes())
    (other / "config.json").write_text("{}")
    assert "; it holds cl100k_base.tiktoken: give that file; " in refusal(other)


def test_a_kept_key_missing_from_an_empty_document_does_not_stop_the_pack(tmp_path,
                                                                            hf_tokenizer):
    """tokenize --keep-column src over JSON Lines whose empty document lacks the key, then
    pack --source-column src: the empty document is skipped (counted as empty), its null
    source with it (it stopped the pack: "fill it"). A real document without the key is
    refused naming the text input's document and the fix that can be followed: fill it there
    and tokenize again (a tokenized output's shards cannot be edited)."""
    lines = [{"text": "hello world", "src": "a"}, {"text": "foo bar", "src": "b"}, None,
             {"text": "x y", "src": "a"}, {"text": ""}, {"text": "end", "src": "b"}]
    src = tmp_path / "t.jsonl"
    src.write_text("".join("\n" if x is None else json.dumps(x) + "\n" for x in lines))
    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "src",
            "--rows-per-shard", 3]
    assert invoke(args + [src, tmp_path / "tok"]).exit_code == 0
    res = invoke(["pack", "-c", 16, "--source-column", "src", tmp_path / "tok", tmp_path / "p"])
    assert res.exit_code == 0, res.output
    m = read_manifest(tmp_path / "p")
    assert m.source_values == ("a", "b") and m.totals.docs_empty == 1
    lines[5] = {"text": "end"}  # the 5th document (line 6), in the second shard
    src.write_text("".join("\n" if x is None else json.dumps(x) + "\n" for x in lines))
    assert invoke(args + ["--overwrite", src, tmp_path / "tok"]).exit_code == 0
    res = invoke(["pack", "-q", "-c", 16, "--source-column", "src", tmp_path / "tok",
                  tmp_path / "p2"])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert res.output.strip() == (
        f"Error: {tmp_path / 'tok' / 'part-00000-00001.parquet'}: row 1 (0-based): "
        "--source-column 'src' is null: tokenize --keep-column keeps a missing key or a null "
        f"as null (here: {src}, document 5 (1-based; blank lines not counted)); fill it in the "
        "text input and tokenize it again ('packtool tokenize --overwrite' with the same "
        "options): a tokenized output's shards cannot be edited")


@pytest.mark.parametrize("name,codec", [
    ("c.jsonl.GZ", "gzip"), ("c.JSONL.GZ", "gzip"), ("c.ndjson.Gz", "gzip"),
    ("c.jsonl.ZST", "zstd"), ("c.Jsonl.Zst", "zstd"), ("c.jsonl.BZ2", "bz2"),
    ("c.NDJSON.bz2", "bz2")])
def test_a_compressed_jsonl_is_decompressed_by_its_suffix_in_any_case(tmp_path, hf_tokenizer,
                                                                      name, codec):
    """A JSON Lines file whose compression suffix is written in capitals (c.jsonl.GZ,
    c.JSONL.ZST) is found as compressed text and decompressed by that suffix, as its lower-case
    twin is (it was read as plain text: 'line 1: not valid JSON (... byte 0x8b ...)')."""
    raw = "".join(json.dumps({"text": t}) + "\n" for t in TEXTS).encode()
    d = tmp_path / "d"
    d.mkdir()
    with pa.CompressedOutputStream(str(d / name), codec) as f:
        f.write(raw)
    (tmp_path / "plain.jsonl").write_bytes(raw)
    for src, out in ((d, "o"), (tmp_path / "plain.jsonl", "p")):
        res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, src, tmp_path / out])
        assert res.exit_code == 0, res.output
    assert (pq.read_table(tmp_path / "o").column("input_ids").to_pylist()
            == pq.read_table(tmp_path / "p").column("input_ids").to_pylist())


def test_a_dictionary_kept_column_is_kept_as_its_values_beside_any_file(tmp_path, hf_tokenizer):
    """A kept column dictionary-encoded in one file (a pandas Categorical) and plain in another
    (string, large_string, JSON Lines text, or int64 beside a dictionary of int16) is written
    as its values in the type both promote to, in every shard (it was refused: 'string here and
    dictionary<values=string, ...> ... with no common type'); a column dictionary-encoded in
    every file is kept as its values too, across row groups of different dictionaries."""
    def run(name, files, want_type, want):
        d = tmp_path / name
        d.mkdir()
        for fname, table in files:
            if fname.endswith(".jsonl"):
                (d / fname).write_text("".join(json.dumps(r) + "\n" for r in table))
            else:
                pq.write_table(table, d / fname, row_group_size=2)
        res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "src",
                      "--batch-docs", 3, "--rows-per-shard", 4, d, f"{tmp_path}/o-{name}/"])
        assert res.exit_code == 0, res.output
        shards = sorted((tmp_path / f"o-{name}").glob("part-*.parquet"))
        assert {pq.read_schema(p).field("src").type for p in shards} == {want_type}
        t = pa.concat_tables(pq.read_table(p) for p in shards)
        assert t.column("src").to_pylist() == want

    cat = pa.array(["x", "y", "x", "z", "y"]).dictionary_encode()
    texts = TEXTS[:5]
    run("str", [("0.parquet", pa.table({"text": texts, "src": cat})),
                ("1.parquet", pa.table({"text": ["b"], "src": pa.array(["w"])}))],
        pa.string(), ["x", "y", "x", "z", "y", "w"])
    run("str-first", [("0.parquet", pa.table({"text": ["b"], "src": pa.array(["w"])})),
                      ("1.parquet", pa.table({"text": texts, "src": cat}))],
        pa.string(), ["w", "x", "y", "x", "z", "y"])
    run("large", [("0.parquet", pa.table({"text": texts, "src": cat})),
                  ("1.parquet", pa.table({"text": ["b"], "src": pa.array(["w"],
                                                                          pa.large_string())}))],
        pa.large_string(), ["x", "y", "x", "z", "y", "w"])
    run("jsonl", [("0.parquet", pa.table({"text": texts, "src": cat})),
                  ("1.jsonl", [{"text": "b", "src": "w"}])],
        pa.string(), ["x", "y", "x", "z", "y", "w"])
    run("ints", [("0.parquet", pa.table({"text": texts, "src": pa.array(
        [1, 2, 1, 3, 2], pa.int16()).dictionary_encode()})),
                 ("1.parquet", pa.table({"text": ["b"], "src": pa.array([70000])}))],
        pa.int64(), [1, 2, 1, 3, 2, 70000])
    run("all", [("0.parquet", pa.table({"text": texts, "src": cat})),
                ("1.parquet", pa.table({"text": ["b", "c"], "src": pa.array(
                    ["v", "x"]).dictionary_encode()}))],
        pa.string(), ["x", "y", "x", "z", "y", "v", "x"])


@pytest.mark.parametrize("jsonl_first", [False, True], ids=["parquet-first", "jsonl-first"])
def test_a_kept_key_no_line_holds_is_named_missing_beside_other_types(tmp_path, hf_tokenizer,
                                                                      jsonl_first):
    """--keep-column k over Parquet files holding an int16 'k' and a JSON Lines file none of
    whose lines holds 'k' (a typo): refused naming the JSON Lines file and the missing key, as a
    lone JSON Lines file is (it said 'string here and int16 ... no common type'), before
    anything is written; a JSON Lines file that holds the key is refused as text beside
    integers, naming both files."""
    d = tmp_path / "kp"
    d.mkdir()
    names = ("0.jsonl", "1.parquet", "2.parquet") if jsonl_first else \
        ("0.parquet", "1.parquet", "2.jsonl")
    jsonl = d / next(n for n in names if n.endswith(".jsonl"))
    parquets = [d / n for n in names if n.endswith(".parquet")]
    for i, p in enumerate(parquets):
        pq.write_table(pa.table({"text": TEXTS[i:i + 2], "k": pa.array([i, 7], pa.int16())}), p)
    write_jsonl(jsonl, TEXTS[:3])  # keys: text, id
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "k", d,
                  tmp_path / "o"])
    assert res.exit_code == 1, res.output
    assert res.output.strip() == (f"Error: {jsonl}: no line holds the key 'k' for --keep-column "
                                  "(keys of the first line: text, id); check the name")
    assert not (tmp_path / "o").exists()
    jsonl.write_text(json.dumps({"text": "a", "k": 3}) + "\n")
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "k", d,
                  tmp_path / "o"])
    assert res.exit_code == 1, res.output
    [line] = res.output.strip().splitlines()
    here, there = (parquets[0], jsonl) if jsonl_first else (jsonl, parquets[0])
    assert line.startswith(f"Error: {here}: kept column 'k' is "), line
    assert f" in {there}, with no common type" in line and "JSON Lines" in line, line
    assert not (tmp_path / "o").exists()
    # a JSON Lines file of no document (blank lines) adds no type, wherever it lies
    jsonl.write_text("\n\n")
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "k", d,
                  tmp_path / "o"])
    assert res.exit_code == 0, res.output
    t = pq.read_table(tmp_path / "o")
    assert t.schema.field("k").type == pa.int16() and t.column("k").to_pylist() == [0, 7, 1, 7]


def test_tokenize_json_counts_the_bos_and_eos_added_and_present(tmp_path, hf_tokenizer):
    """tokenize --json reports the BOS/EOS counts the text summary prints and the manifest
    holds (docs_bos_added, docs_bos_present, docs_eos_added, docs_eos_present; it left them
    out), a rerun of the finished output likewise; 0 without --prepend-bos / --append-eos."""
    texts = ["hello world", "", "a b</s>", "x"]
    src = write_jsonl(tmp_path / "a.jsonl", texts)
    keys = ("docs_bos_added", "docs_bos_present", "docs_eos_added", "docs_eos_present")
    args = ["tokenize", "--json", "--tokenizer", hf_tokenizer, "--prepend-bos", "<s>",
            "--append-eos", "</s>", src, tmp_path / "o"]
    for _ in range(2):  # then already complete
        res = invoke(args)
        assert res.exit_code == 0, res.output
        got = json.loads(res.stdout)
        totals = read_manifest(tmp_path / "o").totals
        assert {k: got[k] for k in keys} == {k: getattr(totals, k) for k in keys}
        assert got["docs_eos_added"] + got["docs_eos_present"] == 3 and got["docs_bos_added"] == 3
    res = invoke(["tokenize", "--json", "--tokenizer", hf_tokenizer, src, tmp_path / "p"])
    assert res.exit_code == 0, res.output
    assert {k: json.loads(res.stdout)[k] for k in keys} == dict.fromkeys(keys, 0)


def test_a_tokenizer_naming_no_special_tokens_gets_advice_of_its_own_kind(tmp_path,
                                                                         tokenizer_files):
    """A special token string given to a tokenizer that names none: the id is asked for, and
    Mistral's Tekken ids (<s> 1, </s> 2) are offered for a Tekken file only (they were offered
    for a tiktoken BPE file read with --tokenizer-pattern and for a tokenizer.json too)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:4])
    bpe = tmp_path / "mytok.tiktoken"  # a name of no tiktoken encoding: --tokenizer-pattern
    bpe.write_bytes(tokenizer_files["tiktoken"][0].read_bytes())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=[]))
    bare = tmp_path / "bare.json"
    tok.save(str(bare))
    tekken = tokenizer_files["tekken"][0]  # lists no special tokens (v3)
    for path, extra, tekken_advice in ((bpe, ["--tokenizer-pattern", r"\S+|\s+"], False),
                                       (bare, [], False), (tekken, [], True)):
        res = invoke(["tokenize", "-q", "--tokenizer", path, *extra, "--append-eos",
                      "<|endoftext|>", src, tmp_path / "o"])
        assert res.exit_code == 2, res.output
        [line] = res.output.strip().splitlines()
        assert f"{path} names no special tokens" in line and "give the token's id" in line, line
        assert ("Tekken" in line and "</s> is 2" in line) == tekken_advice, line
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["labels", "attention_mask", "completion_mask",
                                  "assistant_masks", "position_ids", "segment_ids"])
def test_a_kept_column_pack_would_read_as_a_mask_or_packed_rows_is_refused(tmp_path,
                                                                          hf_tokenizer, name):
    """--keep-column of a column pack reads by its name (under --labels-column auto and its
    kin: per-token labels and masks; or as packed rows) is refused at tokenize in one line
    naming why and the fix, exit 2, nothing written: carried beside new input_ids it was read
    by pack as a mask (applied in silence when its lengths matched) or refused there."""
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["hello world", "a b"], name: [[1, 1], [1, 1]],
                             "labels_text": ["pos", "neg"]}), src)
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", name, src,
                  tmp_path / "o"])
    assert res.exit_code == 2, res.output
    [line] = res.output.strip().splitlines()
    assert line.startswith(f"Error: --keep-column {name!r}: pack ") and "rename" in line, line
    assert not (tmp_path / "o").exists()
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "labels_text",
                  src, tmp_path / "o"])
    assert res.exit_code == 0, res.output
    assert invoke(["pack", "-q", "-c", 16, tmp_path / "o", tmp_path / "p"]).exit_code == 0


@pytest.mark.parametrize("values", [pa.array(["5", "7"]), pa.array([5, 7], pa.int16()),
                                    pa.array([["a"], ["b", "c"]], pa.list_(pa.string()))])
def test_a_kept_column_named_as_a_packed_column_is_written_in_any_type(tmp_path, hf_tokenizer,
                                                                       values):
    """--keep-column doc_ids (strings, as JSON Lines keeps every key, or int16) failed at the
    shard's write with pyarrow's 'DELTA_BINARY_PACKED encoder only supports INT32 and INT64':
    the writer gave it the encoding of the packed doc_ids column by its name. A column of
    another type keeps pyarrow's default encoding; its values come back as they were."""
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["hello world", "a b"], "doc_ids": values}), src)
    _tokenized(src, tmp_path / "o", hf_tokenizer, "--keep-column", "doc_ids")
    shards = sorted(p for p in (tmp_path / "o").glob("*.parquet") if "manifest" not in p.name)
    assert pq.read_table(shards[0])["doc_ids"].to_pylist() == values.to_pylist()
    (tmp_path / "j.jsonl").write_text('{"text": "hello world", "doc_ids": 5}\n')
    _tokenized(tmp_path / "j.jsonl", tmp_path / "oj", hf_tokenizer, "--keep-column", "doc_ids")


def test_a_template_adding_special_tokens_leaves_the_bos_and_eos_unknown(tmp_path, hf_tokenizer):
    """tokenize --add-special-tokens with a tokenizer whose post-processor adds <s> ... </s>:
    every document ends in </s>, yet stats said 'EOS added by tokenize none' and export knew no
    EOS id. An id no option gave is now not recorded (stats says why), never 'none'."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(hf_tokenizer))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", tok.token_to_id("<s>")),
                                              ("</s>", tok.token_to_id("</s>"))])
    templated = tmp_path / "templated.json"
    tok.save(str(templated))
    src = write_jsonl(tmp_path / "t.jsonl", ["hello world", "a b c"])
    _tokenized(src, tmp_path / "tok", templated, "--add-special-tokens")
    assert invoke(["pack", "-q", "-c", 16, tmp_path / "tok", tmp_path / "out"]).exit_code == 0
    from packtool.formats.manifest import read_manifest

    record = read_manifest(tmp_path / "out").tokenized
    assert not record.knows("append_eos") and not record.knows("prepend_bos"), record
    res = invoke(["stats", tmp_path / "out"])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "EOS added by tokenize" in ln)
    assert "not recorded" in line and "--add-special-tokens" in line and "none" not in line
    _tokenized(src, tmp_path / "tok2", templated, "--add-special-tokens", "--append-eos", "</s>")
    assert invoke(["pack", "-q", "-c", 16, tmp_path / "tok2", tmp_path / "out2"]).exit_code == 0
    record = read_manifest(tmp_path / "out2").tokenized  # given by the option: known
    assert record.append_eos == tok.token_to_id("</s>") and not record.knows("prepend_bos")


def test_a_tokenizer_given_as_a_file_uri_is_read_as_its_local_path(tmp_path, hf_tokenizer):
    """--tokenizer file:///abs/tokenizer.json was refused as 'read from a local file; download
    it first', though it names one; it is read as that path (file://localhost too), a store
    URI is still refused, and file:relative is refused as no location."""
    src = write_jsonl(tmp_path / "t.jsonl", ["hello world"])
    for i, uri in enumerate([f"file://{hf_tokenizer}", f"file://localhost{hf_tokenizer}"]):
        _tokenized(src, tmp_path / f"o{i}", uri)
    res = invoke(["tokenize", "-q", "--tokenizer", "s3://bucket/tokenizer.json", src,
                  tmp_path / "o9"])
    assert res.exit_code == 2 and "read from a local file" in res.output, res.output
    res = invoke(["tokenize", "-q", "--tokenizer", "file:tokenizer.json", src, tmp_path / "o8"])
    assert res.exit_code != 0 and "file:" in res.output and "Traceback" not in res.output


def _tokenized(src, out, tokenizer, *flags):
    """``packtool tokenize`` ``src`` into ``out`` with ``tokenizer``, asserting success."""
    res = invoke(["tokenize", "-q", "--tokenizer", tokenizer, *flags, src, out])
    assert res.exit_code == 0, res.output
    return out


def _tokenizer_lines(res):
    return [ln for ln in res.stderr.splitlines() if "different tokenizers" in ln]


def test_a_pack_of_tokenize_outputs_records_their_tokenizer_and_ids_for_export_and_stats(
        tmp_path, hf_tokenizer):
    """tokenize --prepend-bos </s> --append-eos </s> (every document [EOS, ..., EOS]), then
    pack: the tokenizer and the ids were in the tokenize manifests only, so export --to nemo
    knew no EOS id without --eos-id and said nothing of the EOS opening every document. The
    packed manifest now records them (two tokenize outputs of one tokenizer agree); the export
    looks for that EOS id by itself and warns as with --eos-id; stats names the tokenizer and
    the ids."""
    tok = tokenizers.Tokenizer.from_file(str(hf_tokenizer))
    eos = tok.token_to_id("</s>")
    flags = ("--prepend-bos", "</s>", "--append-eos", "</s>")
    a = _tokenized(write_jsonl(tmp_path / "a.jsonl", TEXTS[:12]), tmp_path / "tok-a",
                   hf_tokenizer, *flags)
    b = _tokenized(write_jsonl(tmp_path / "b.jsonl", TEXTS[12:20]), tmp_path / "tok-b",
                   hf_tokenizer, *flags)
    out = tmp_path / "packed"
    res = invoke(["pack", "-q", "-c", 64, "--no-shuffle", a, b, out])
    assert res.exit_code == 0 and not _tokenizer_lines(res), res.output
    m, made = read_manifest(out), read_manifest(a).options["tokenizer"]
    assert m.options.get("append_eos") is None  # pack's own --append-eos was not given
    t = m.tokenized
    assert (t.tokenizer.kind, t.tokenizer.sha256, t.tokenizer.file, t.tokenizer.vocab_size,
            t.tokenizer.library_version) == (made["kind"], made["sha256"], hf_tokenizer.name,
                                             made["vocab_size"], made["library_version"])
    assert (t.append_eos, t.prepend_bos, t.differs) == (eos, eos, ())

    told = invoke(["export", "--to", "nemo", "--json", "--eos-id", eos, out, tmp_path / "told"])
    found = invoke(["export", "--to", "nemo", "--json", out, tmp_path / "found"])
    assert told.exit_code == found.exit_code == 0, found.output
    said = [ln for ln in found.stderr.splitlines() if "the EOS id" in ln]
    assert said and said == [ln for ln in told.stderr.splitlines() if "the EOS id" in ln]
    assert f"hold the EOS id {eos} before their last token" in said[0]
    got, want = json.loads(found.stdout), json.loads(told.stdout)
    # every document but the empty ones (tokenize adds nothing to them) opens with EOS
    assert got["eos_id"] == eos and got["eos_documents"] == sum(1 for x in TEXTS[:20] if x)
    assert {k: v for k, v in got.items() if k not in ("path", "metadata")} == \
        {k: v for k, v in want.items() if k not in ("path", "metadata")}

    res = invoke(["stats", "--no-hash", out])
    assert res.exit_code == 0, res.output
    sha = made["sha256"][:12]
    assert (f"  tokenizer                 tokenizer.json (tokenizers, {made['vocab_size']:,} ids, "
            f"sha256 {sha})") in res.output.splitlines()
    assert f"  EOS added by tokenize     id {eos}" in res.output.splitlines()
    assert f"  BOS added by tokenize     id {eos}" in res.output.splitlines()
    doc = json.loads(invoke(["stats", "--json", "--no-hash", out]).stdout)
    assert doc["tokenized"] == {"tokenizer": t.tokenizer.to_dict(), "append_eos": eos,
                                "prepend_bos": eos}
    assert doc["tokenized"]["tokenizer"]["sha256"] == made["sha256"]


def test_an_export_names_an_eos_id_the_manifest_records_that_it_did_not_look_for(
        tmp_path, hf_tokenizer):
    """tokenize --append-eos </s>, then pack --append-eos <s> (every document [..., </s>, <s>]):
    the export looks for pack's id (the documented order) and said nothing of the tokenizer's
    </s>, fed before every document's last token. It now says, in a note, that tokenize appended
    another EOS id and how to look for it (--eos-id); told that id, it counts the documents
    holding it and names pack's other id likewise; one id recorded once is no note."""
    from packtool.formats.nemo import export_nemo

    tok = tokenizers.Tokenizer.from_file(str(hf_tokenizer))
    eos, other = tok.token_to_id("</s>"), tok.token_to_id("<s>")
    a = _tokenized(write_jsonl(tmp_path / "a.jsonl", TEXTS[:12]), tmp_path / "tok-a",
                   hf_tokenizer, "--append-eos", "</s>")
    out = tmp_path / "packed"
    res = invoke(["pack", "-q", "-c", 64, "--append-eos", other, a, out])
    assert res.exit_code == 0, res.output
    assert read_manifest(out).tokenized.append_eos == eos

    def notes(res):
        return [ln[len("  note: "):] for ln in res.stdout.splitlines()
                if ln.startswith("  note: ")]

    res = invoke(["export", "--to", "nemo", out, tmp_path / "nemo"])
    assert res.exit_code == 0, res.output
    assert notes(res) == [
        f"packtool tokenize appended the EOS id {eos} to the documents (the manifest's "
        f"tokenized.append_eos), and this export looked for {other} only: if {eos} is the "
        f"trainer's tokenizer's EOS id, rerun with --eos-id {eos} (Python: eos_id={eos}) to count "
        "the documents holding it before their last token (docs/python-and-text.md)"]
    done = json.loads(invoke(["export", "--to", "nemo", "--json", out,
                              tmp_path / "nemo"]).stdout)  # finished already: the same note
    assert done["already_complete"] and done["notes"] == notes(res)
    assert export_nemo(out, tmp_path / "py").notes == tuple(notes(res))

    told = invoke(["export", "--to", "nemo", "--eos-id", eos, out, tmp_path / "told"])
    assert told.exit_code == 0, told.output
    assert notes(told) == [
        f"pack --append-eos appended the EOS id {other} to the documents, and this export "
        f"looked for {eos} only: if {other} is the trainer's tokenizer's EOS id, rerun with "
        f"--eos-id {other} (Python: eos_id={other}) to count the documents holding it before "
        "their last token (docs/python-and-text.md)"]
    assert [ln for ln in told.stderr.splitlines() if f"the EOS id {eos} before" in ln]

    same = tmp_path / "same"
    assert invoke(["pack", "-q", "-c", 64, "--append-eos", eos, a, same]).exit_code == 0
    res = invoke(["export", "--to", "nemo", same, tmp_path / "same-nemo"])
    assert res.exit_code == 0 and notes(res) == [], res.output


def test_inputs_that_disagree_record_only_what_they_agree_on(tmp_path, hf_tokenizer,
                                                             tokenizer_files):
    """One tokenizer, --append-eos given to one tokenize only: the tokenizer and the BOS (none)
    are recorded, the EOS id is not (export looks for none). Two tokenizers: nothing is
    recorded (an id means nothing without its tokenizer) and pack warns in one line naming
    both outputs and their tokenizers. A tokenize output with plain Parquet: nothing is
    recorded (nothing says the Parquet's tokenizer), no warning. Plain Parquet alone: nothing.
    The shards are those of the same pack without any record."""
    src = write_jsonl(tmp_path / "t.jsonl", TEXTS[:10])
    eos_a = _tokenized(src, tmp_path / "eos", hf_tokenizer, "--append-eos", "</s>")
    bare = _tokenized(src, tmp_path / "bare", hf_tokenizer)
    tekken = _tokenized(src, tmp_path / "tekken", tokenizer_files["tekken"][0],
                        "--append-eos", 2)
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pa.table({"input_ids": [[5, 6, 7], [8, 9]]}), plain / "d.parquet")

    def pack(name, *inputs):
        res = invoke(["pack", "-q", "-c", 64, *inputs, tmp_path / name])
        assert res.exit_code == 0, res.output
        return res, read_manifest(tmp_path / name)

    res, m = pack("one-eos", eos_a, bare)
    assert not _tokenizer_lines(res)
    sha = read_manifest(bare).options["tokenizer"]["sha256"]
    assert m.tokenized.tokenizer.sha256 == sha
    assert (m.tokenized.append_eos, m.tokenized.prepend_bos) == (None, None)
    assert m.tokenized.differs == ("append_eos",) and not m.tokenized.knows("append_eos")
    assert "append_eos" not in m.to_dict()["tokenized"]
    assert m.to_dict()["tokenized"]["prepend_bos"] is None  # recorded: no BOS was added
    got = json.loads(invoke(["export", "--to", "nemo", "--json", tmp_path / "one-eos",
                             tmp_path / "nemo"]).stdout)
    assert got["eos_id"] is None

    res, m = pack("two-tokenizers", eos_a, tekken)
    assert m.tokenized is None and "tokenized" not in m.to_dict()
    line, = _tokenizer_lines(res)
    assert line.startswith(f"WARNING: INPUT holds the ids of different tokenizers: {eos_a} was "
                           "tokenized with tokenizer.json (tokenizers, ")
    assert f"{tekken} with tekken_t.json (tekken, {tokenizer_files['tekken'][1]:,} ids" in line
    assert line.endswith("tokenize every input with one tokenizer (packtool tokenize "
                         "--tokenizer FILE), then pack again with --overwrite")
    res = invoke(["pack", "--json", "-c", 64, "--overwrite", eos_a, tekken,
                  tmp_path / "two-tokenizers"])
    assert any("different tokenizers" in w for w in json.loads(res.stdout)["warnings"])
    assert "tokenizer " not in invoke(["stats", "--no-hash", tmp_path / "two-tokenizers"]).output

    res, m = pack("with-plain", eos_a, plain)
    assert m.tokenized is None and not _tokenizer_lines(res)
    res, m = pack("plain-only", plain)
    assert m.tokenized is None and "tokenized" not in m.to_dict()
    # the record changes no shard: the same ids packed from plain Parquet give the same bytes
    same = tmp_path / "same"
    same.mkdir()
    pq.write_table(pq.read_table(eos_a).select(["input_ids"]), same / "d.parquet")
    _, p = pack("from-parquet", same)
    _, t = pack("from-tokenize", eos_a)
    assert t.tokenized is not None and p.tokenized is None
    assert [s.sha256 for s in t.shards] == [s.sha256 for s in p.shards]


def test_the_tokenized_record_reads_back_and_manifests_without_it_read_as_before(
        tmp_path, hf_tokenizer):
    """A manifest written before the record (no ``tokenized`` key) reads as before, with none;
    the record reads back equal, through JSON and pickling; an id absent from it is one the
    inputs disagreed on. A key this packtool does not know is ignored, as every reader of
    version 4 ignores ``tokenized`` (the record needs no new format version)."""
    import pickle

    from packtool.formats.manifest import Manifest, Tokenization, TokenizerInfo

    a = _tokenized(write_jsonl(tmp_path / "a.jsonl", TEXTS[:6]), tmp_path / "tok",
                   hf_tokenizer, "--append-eos", "</s>")
    assert invoke(["pack", "-q", "-c", 32, a, tmp_path / "out"]).exit_code == 0
    m = read_manifest(tmp_path / "out")
    d = json.loads(json.dumps(m.to_dict()))
    assert d["format_version"] == 4 and d["tokenized"]["append_eos"] == m.tokenized.append_eos
    assert Manifest.from_dict(d) == m and pickle.loads(pickle.dumps(m)) == m
    older = {k: v for k, v in d.items() if k != "tokenized"}
    o = Manifest.from_dict(older)
    assert o.tokenized is None and o.to_dict() == older
    assert Manifest.from_dict({**d, "written_by_a_later_packtool": {"x": 1}}) == m
    d["tokenized"].pop("append_eos")
    back = Manifest.from_dict(d).tokenized
    assert back.differs == ("append_eos",) and back.append_eos is None
    assert back.tokenizer == m.tokenized.tokenizer
    one = TokenizerInfo("tokenizers", "a" * 64, "t.json", 10)
    other = TokenizerInfo("tiktoken", "a" * 64, "t.json", 10)  # another kind: another reading
    assert Tokenization.common([Tokenization(one, 2), Tokenization(other, 2)]) is None
    assert Tokenization.common([Tokenization(one, 2), None]) is None
    renamed = TokenizerInfo("tokenizers", "a" * 64, "copy.json", 10)
    assert Tokenization.common([Tokenization(one, 2), Tokenization(renamed, 2)]) == \
        Tokenization(TokenizerInfo("tokenizers", "a" * 64, None, 10), 2)


def test_tokenize_into_a_folder_inside_a_pack_being_written_is_refused(tmp_path, hf_tokenizer):
    """A pack that holds only its lock and scratch (reading, no marker yet) is a packtool
    output all the same: tokenize OUTPUT inside it is refused in one line, nothing written."""
    import signal

    from packcheck import paused_pack, write_docs

    docs = write_docs(tmp_path / "in" / "a.parquet", [[1, 2, 3]] * 8)
    out = tmp_path / "p"
    src = write_jsonl(tmp_path / "a.jsonl", TEXTS[:6])
    with paused_pack(docs, out, "read:0", ["-c", 16], stop=signal.SIGINT):
        res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, src, out / "tok"])
        assert res.exit_code == 1, res.output
        assert res.output.strip() == (f"Error: {out / 'tok'}: OUTPUT is inside the packtool "
                                      f"output {out.resolve()}; choose a location outside it")
        assert not (out / "tok").exists()


def test_a_pack_id_outside_the_recorded_vocabulary_is_warned_by_pack_stats_export_and_api(
        tmp_path, hf_tokenizer):
    """pack --pad-id / --append-eos / --prepend-bos of an id >= V, the vocabulary of the
    tokenizer the inputs were tokenized with (recorded by tokenize), packed silently: padding
    and boundaries feed that id to the embedding (IndexError on CPU, a device assert on a
    GPU). Each such id is now one WARNING line of pack (rc 0: a model's embedding may be
    larger than the tokenizer), of stats and of export, naming V and the fix; an id below V,
    or inputs with no recorded tokenizer, say nothing."""
    import warnings

    import packtool
    from packtool.errors import PackWarning

    v = tokenizers.Tokenizer.from_file(str(hf_tokenizer)).get_vocab_size(with_added_tokens=True)
    eos = tokenizers.Tokenizer.from_file(str(hf_tokenizer)).token_to_id("</s>")
    tok = _tokenized(write_jsonl(tmp_path / "t.jsonl", TEXTS[:10]), tmp_path / "tok",
                     hf_tokenizer, "--append-eos", "</s>")

    def vocab_lines(text):
        return [ln for ln in text.splitlines() if "outside the vocabulary" in ln]

    res = invoke(["pack", "-q", "-c", 64, "--pad-id", v, "--prepend-bos", v + 7,
                  "--append-eos", eos, tok, tmp_path / "out"])
    assert res.exit_code == 0, res.output
    pad, bos = vocab_lines(res.stderr)
    assert pad == (f"WARNING: --pad-id {v} is outside the vocabulary of tokenizer.json ({v} ids: "
                   f"0..{v - 1}) the inputs were tokenized with: every padded position holds "
                   f"id {v}, which fails at the model's embedding unless it has more than {v} "
                   f"rows; pack with --pad-id <an id below {v}, e.g. the EOS id {eos}>")
    assert bos.startswith(f"WARNING: --prepend-bos {v + 7} is outside the vocabulary")
    res = invoke(["stats", "--no-hash", tmp_path / "out"])
    assert res.exit_code == 0
    lines = vocab_lines(res.stderr)
    assert [ln.split(" is ")[0] for ln in lines] == [f"WARNING: --pad-id {v}",
                                                     f"WARNING: --prepend-bos {v + 7}"]
    assert all(ln.endswith("and --overwrite") for ln in lines)
    got = json.loads(invoke(["stats", "--json", "--no-hash", tmp_path / "out"]).stdout)
    assert len(vocab_lines("\n".join(got["warnings"]))) == 2
    res = invoke(["export", "--to", "nemo", tmp_path / "out", tmp_path / "nemo.npy"])
    # the export writes no padding: only the BOS id is in its tokens
    assert [ln.split(" is ")[0] for ln in vocab_lines(res.stderr)] == [
        f"WARNING: --prepend-bos {v + 7}"], res.output
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        packtool.pack([str(tok)], str(tmp_path / "api"), capacity=64, pad_id=v + 1,
                      progress=False)
    said = [str(w.message) for w in caught if issubclass(w.category, PackWarning)]
    assert any(f"pad_id={v + 1} is outside the vocabulary" in s for s in said), said
    # inside the vocabulary, or no tokenizer recorded (plain Parquet): nothing to say
    res = invoke(["pack", "-q", "-c", 64, "--pad-id", v - 1, tok, tmp_path / "inside"])
    assert res.exit_code == 0 and not vocab_lines(res.stderr)
    assert not vocab_lines(invoke(["stats", "--no-hash", tmp_path / "inside"]).stderr)
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pq.read_table(tok).select(["input_ids"]), plain / "d.parquet")
    res = invoke(["pack", "-q", "-c", 64, "--pad-id", v, plain, tmp_path / "from-plain"])
    assert res.exit_code == 0 and not vocab_lines(res.stderr)


def test_a_pad_id_outside_the_vocabulary_is_not_warned_of_when_no_padding_is_written(
        tmp_path, hf_tokenizer):
    """pack --pad-id V (outside the recorded vocabulary) --min-fill 1 writes only full rows:
    no position holds the pad id, so neither pack nor stats warn of it (an --append-eos id
    outside it still is, by both); export never writes padding, so it does not warn of the pad
    id even when the rows hold padding."""
    v = tokenizers.Tokenizer.from_file(str(hf_tokenizer)).get_vocab_size(with_added_tokens=True)
    tok = _tokenized(write_jsonl(tmp_path / "t.jsonl", TEXTS[:10]), tmp_path / "tok",
                     hf_tokenizer)

    def vocab_lines(text):
        return [ln.split(" is ")[0] for ln in text.splitlines() if "outside the vocabulary" in ln]

    full = tmp_path / "full"
    res = invoke(["pack", "-q", "-c", 4, "--pad-id", v, "--append-eos", v + 3, "--min-fill", 1,
                  tok, full])
    assert res.exit_code == 0, res.output
    totals = read_manifest(full).totals
    assert totals.rows > 0 and totals.padding_tokens == 0
    assert vocab_lines(res.stderr) == [f"WARNING: --append-eos {v + 3}"], res.output
    res = invoke(["stats", "--no-hash", full])
    assert res.exit_code == 0 and vocab_lines(res.stderr) == [f"WARNING: --append-eos {v + 3}"], \
        res.output
    padded = tmp_path / "padded"
    res = invoke(["pack", "-q", "-c", 64, "--pad-id", v, tok, padded])
    assert res.exit_code == 0 and vocab_lines(res.stderr) == [f"WARNING: --pad-id {v}"]
    assert read_manifest(padded).totals.padding_tokens > 0
    res = invoke(["export", "--to", "nemo", padded, tmp_path / "nemo.npy"])
    assert res.exit_code == 0 and not vocab_lines(res.stderr), res.output


def _one_error(res, status=1):
    """The one ``Error:`` line of a refused run (never an internal error)."""
    assert res.exit_code == status, res.output
    [line] = res.output.strip().splitlines()
    assert line.startswith("Error: ") and "internal error" not in line, line
    return line


#: half a surrogate pair written as UTF-8 bytes (CESU-8 and WTF-8 writers do): not UTF-8
CESU = b"\xed\xa0\xbd"


@pytest.mark.parametrize("kind", ["tokenizers", "tekken", "tiktoken"])
def test_bytes_that_are_not_utf8_are_refused_for_every_tokenizer_and_input(tmp_path,
                                                                           tokenizer_files, kind):
    """Surrogate bytes (ED A0 BD) in a JSON Lines line, plain or compressed, in its text or a
    kept key, and in a kept Parquet or Arrow string column: one line naming the file and the
    line or row, 'not valid UTF-8; re-encode ... as UTF-8', exit 1, nothing written. They were
    decoded with surrogatepass: an internal error with a tokenizer.json or a kept key, the
    character silently replaced by U+FFFD with tiktoken and Tekken."""
    import gzip

    path, _ = tokenizer_files[kind]
    raw = b'{"text": "ok", "k": "a"}\n{"text": "half ' + CESU + b' pair", "k": "b"}\n'
    kept = b'{"text": "ok", "k": "a"}\n{"text": "b", "k": "x ' + CESU + b'"}\n'
    (tmp_path / "raw.jsonl").write_bytes(raw)
    (tmp_path / "raw.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "kept.jsonl").write_bytes(kept)
    bad = pa.array([b"fine", b"x " + CESU], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"text": ["a", "b"], "k": bad}), tmp_path / "kept.parquet")
    with pa.OSFile(str(tmp_path / "kept.arrow"), "wb") as f:
        with pa.ipc.new_file(f, pa.schema([("text", pa.string()), ("k", pa.string())])) as w:
            w.write_table(pa.table({"text": ["a", "b"], "k": bad}))
    pq.write_table(pa.table({"text": bad}), tmp_path / "text.parquet")
    cases = [("raw.jsonl", (), "line 2: 'text'"), ("raw.jsonl.gz", (), "line 2: 'text'"),
             ("raw.jsonl", ("--keep-column", "k"), "line 2: 'text'"),
             ("kept.jsonl", ("--keep-column", "k"), "line 2: 'k'"),
             ("kept.parquet", ("--keep-column", "k"), "row 1 (0-based): kept column 'k'"),
             ("kept.arrow", ("--keep-column", "k"), "row 1 (0-based): kept column 'k'"),
             ("text.parquet", (), "row 1 (0-based): 'text'")]
    for i, (name, flags, where) in enumerate(cases):
        out = tmp_path / f"o{i}"
        line = _one_error(invoke(["tokenize", "-q", "--tokenizer", path, *flags,
                                  tmp_path / name, out]))
        assert line.startswith(f"Error: {tmp_path / name}: {where} is not valid UTF-8"), line
        assert "re-encode" in line and "as UTF-8" in line, line
        assert not out.exists()
    # the same text, valid: tokenized as ever
    (tmp_path / "good.jsonl").write_bytes(raw.replace(CESU, "\U0001F600".encode()))
    assert invoke(["tokenize", "-q", "--tokenizer", path, tmp_path / "good.jsonl",
                   tmp_path / "g"]).exit_code == 0


def _encoding_threads(path, threads: int) -> int:
    """Threads of this process that spent at least a tenth of the CPU time of encoding a large
    batch with :func:`load_tokenizer` ``(path, threads=threads)`` (their CPU time read from
    /proc/self/task/*/stat before and after)."""
    import os

    from packtool.text.tokenizer import load_tokenizer

    def cpu():
        got = {}
        for t in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{t}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            got[t] = int(fields[11]) + int(fields[12])  # utime + stime, clock ticks
        return got

    tok = load_tokenizer(path, threads=threads)
    texts = [f"{i} " + " ".join(TEXTS) for i in range(3000)]
    tok.encode(texts[:10])
    before = cpu()
    tok.encode(texts)
    after = cpu()
    used = {t: after[t] - before.get(t, 0) for t in after}
    total = sum(used.values())
    assert total > 20, used  # enough work to see where it ran
    return sum(1 for v in used.values() if v >= total / 10)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_workers_bounds_the_threads_encoding_with_a_tokenizer_json(hf_tokenizer):
    """-j 1 encodes a tokenizer.json on one thread: the tokenizers library's own pool took
    every core whatever -j said; -j 2 uses at most two, and the ids are the same."""
    import os

    assert _encoding_threads(hf_tokenizer, 1) == 1
    if (os.cpu_count() or 1) >= 2:
        assert _encoding_threads(hf_tokenizer, 2) <= 2
    from packtool.text.tokenizer import load_tokenizer

    one, two = (load_tokenizer(hf_tokenizer, threads=n).encode(TEXTS) for n in (1, 2))
    assert [a.tolist() for a in one] == [b.tolist() for b in two]


@pytest.mark.parametrize("before", [None, "true"])
def test_the_callers_tokenizers_parallelism_is_put_back(hf_tokenizer, monkeypatch, before):
    """The library's pool is off only while packtool encodes: the process's own
    TOKENIZERS_PARALLELISM (or none) is what other code using tokenizers sees after it."""
    import os

    from packtool.text.tokenizer import load_tokenizer

    if before is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", before)
    load_tokenizer(hf_tokenizer, threads=2).encode(TEXTS)
    assert os.environ.get("TOKENIZERS_PARALLELISM") == before


def _refused_jsonl(tmp_path, tokenizer, name, data, *flags):
    """The one Error line of tokenize of a file ``name`` holding ``data``."""
    (tmp_path / name).write_bytes(data)
    return _one_error(invoke(["tokenize", "-q", "--tokenizer", tokenizer, *flags,
                              tmp_path / name, tmp_path / f"o-{name}-tokenized"]))


def test_jsonl_whose_bytes_say_another_compression_than_its_name(tmp_path, hf_tokenizer):
    """JSON Lines whose first bytes disagree with its name (gzip or zstd named .jsonl, plain
    text or zstd named .jsonl.gz, plain named .bz2): what it is and the name to give it (it
    said 'not valid JSON (... byte 0x8b)' or 'cannot be read after line 0'); a damaged start of
    a real gzip file is damaged, with no count of lines never read."""
    import gzip

    body = b'{"text": "a"}\n{"text": "b"}\n'

    def err(name, data):
        return _refused_jsonl(tmp_path, hf_tokenizer, name, data)

    def zstd(data):
        sink = pa.BufferOutputStream()
        with pa.CompressedOutputStream(sink, "zstd") as f:
            f.write(data)
        return sink.getvalue().to_pybytes()

    line = err("x.jsonl", gzip.compress(body))
    assert line == (f"Error: {tmp_path / 'x.jsonl'}: is compressed with gzip but named .jsonl: "
                    "rename it to x.jsonl.gz"), line
    line = err("z.ndjson", zstd(body))
    assert "is compressed with zstd but named .ndjson: rename it to z.ndjson.zst" in line, line
    line = err("p.jsonl.gz", body)
    assert line == (f"Error: {tmp_path / 'p.jsonl.gz'}: is not gzip-compressed (its bytes are "
                    "plain): rename it to p.jsonl"), line
    line = err("q.jsonl.gz", zstd(body))
    assert "q.jsonl.gz: is not gzip-compressed (its bytes are zstd): rename it to " \
           "q.jsonl.zst" in line, line
    line = err("r.jsonl.bz2", body)
    assert "r.jsonl.bz2: is not bz2-compressed (its bytes are plain): rename it to r.jsonl" \
        in line, line
    line = err("d.jsonl.gz", gzip.compress(body)[:12] + b"\x00" * 40)
    assert "d.jsonl.gz: cannot be read (" in line and "after line" not in line, line


def _compressed(data: bytes, codec: str) -> bytes:
    """``data`` compressed with ``codec`` (pyarrow's codec names), as its tool writes it."""
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, codec) as f:
        f.write(data)
    return sink.getvalue().to_pybytes()


def test_jsonl_holding_another_container_names_it_not_its_text_encoding(tmp_path, hf_tokenizer):
    """JSON Lines whose content (decompressed by its name) is a known container: gzip inside
    gzip, inside .bz2 or .zst (compressed twice); xz, lz4 or zip inside gzip; Parquet or Arrow
    IPC under a .jsonl name, compressed or not; a Git LFS pointer, under a plain or a
    compressed name. Each is named, with the fix (it said "looks like UTF-16 ... iconv",
    "re-encode the file as UTF-8", "not valid JSON" or "its bytes are plain")."""
    import gzip
    import io
    import lzma
    import zipfile

    body = b'{"text": "a"}\n{"text": "b"}\n'
    table = pa.table({"text": ["a", "b"]})
    parquet = io.BytesIO()
    pq.write_table(table, parquet)
    arrow = pa.BufferOutputStream()
    with pa.ipc.new_file(arrow, table.schema) as w:
        w.write_table(table)
    stream = pa.BufferOutputStream()
    with pa.ipc.new_stream(stream, table.schema) as w:
        w.write_table(table)
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("a.jsonl", body)
    lz4 = _compressed(body, "lz4")
    pointer = (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64
               + b"\nsize 1234\n")
    cases = {
        "gg.jsonl.gz": (gzip.compress(gzip.compress(body)),
                        "is compressed twice (gzip inside gzip); decompress both: gunzip -c "
                        "{p} | gunzip > {d}/gg.jsonl"),
        "gb.jsonl.bz2": (_compressed(gzip.compress(body), "bz2"),
                         "is compressed twice (gzip inside bzip2); decompress both: bunzip2 -c "
                         "{p} | gunzip > {d}/gb.jsonl"),
        "gz.jsonl.zst": (_compressed(gzip.compress(body), "zstd"),
                         "is compressed twice (gzip inside zstd); decompress both: zstd -dc "
                         "{p} | gunzip > {d}/gz.jsonl"),
        "zg.ndjson.gz": (gzip.compress(_compressed(body, "zstd")),
                         "is compressed twice (zstd inside gzip); decompress both: gunzip -c "
                         "{p} | zstd -d > {d}/zg.ndjson"),
        "xg.jsonl.gz": (gzip.compress(lzma.compress(body)),
                        "is compressed twice (xz inside gzip); decompress both: gunzip -c "
                        "{p} | unxz > {d}/xg.jsonl"),
        "lg.jsonl.gz": (gzip.compress(lz4),
                        "is compressed twice (lz4 inside gzip); decompress both: gunzip -c "
                        "{p} | lz4 -d > {d}/lg.jsonl"),
        "zip.jsonl.gz": (gzip.compress(zipped.getvalue()),
                         "is a zip archive compressed with gzip; decompress it: gunzip -c {p} > "
                         "{d}/zip.zip, then unzip that"),
        "pq.jsonl": (parquet.getvalue(),
                     "is a Parquet file named like JSON Lines; rename it to *.parquet"),
        "ar.jsonl": (arrow.getvalue().to_pybytes(),
                     "is an Arrow IPC file named like JSON Lines; rename it to *.arrow"),
        "st.jsonl": (stream.getvalue().to_pybytes(),
                     "is an Arrow IPC file named like JSON Lines; rename it to *.arrow"),
        "pq.jsonl.gz": (gzip.compress(parquet.getvalue()),
                        "is a Parquet file compressed with gzip, not JSON Lines; decompress it: "
                        "gunzip -c {p} > {d}/pq.parquet (Parquet compresses inside the file)"),
        "ar.jsonl.bz2": (_compressed(arrow.getvalue().to_pybytes(), "bz2"),
                         "is an Arrow IPC file compressed with bzip2, not JSON Lines; decompress "
                         "it: bunzip2 -c {p} > {d}/ar.arrow (Arrow IPC compresses inside the "
                         "file)"),
        "lfs.jsonl": (pointer, "is a Git LFS pointer, not the data (the repository was cloned "
                      "without its LFS files): run git lfs pull in that repository"),
        # stored as it is under a compressed name: what it is, not "its bytes are plain"
        "lfs.jsonl.gz": (pointer, "is a Git LFS pointer, not the data (the repository was "
                         "cloned without its LFS files): run git lfs pull in that repository"),
        "pq2.jsonl.zst": (parquet.getvalue(),
                          "is a Parquet file named like JSON Lines; rename it to *.parquet"),
    }
    for name, (data, fix) in cases.items():
        p = tmp_path / name
        line = _refused_jsonl(tmp_path, hf_tokenizer, name, data)
        assert line == f"Error: {p}: " + fix.format(p=p, d=tmp_path), line
        for wrong in ("UTF-16", "iconv", "UTF-8", "not valid JSON"):
            assert wrong not in line, line
    # the same content under a directory INPUT, and read for --keep-column first
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "gg.jsonl.gz").write_bytes(cases["gg.jsonl.gz"][0])
    line = _one_error(invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column",
                              "id", folder, tmp_path / "o-folder"]))
    assert "gg.jsonl.gz: is compressed twice (gzip inside gzip)" in line, line


def test_jsonl_bytes_that_are_not_utf8_are_named_not_utf8(tmp_path, hf_tokenizer):
    """Latin-1 or UTF-16 JSON Lines: 'not valid UTF-8' with the line (and the key holding the
    bytes where the line parses) and 're-encode the file as UTF-8', not 'not valid JSON'."""
    for name, data, where in (
            ("latin.jsonl", '{"text": "ok"}\n{"text": "café"}\n'.encode("latin-1"),
             "line 2: 'text' is"),
            ("utf16.jsonl", '{"text": "ok"}\n'.encode("utf-16"), "line 1:")):
        line = _refused_jsonl(tmp_path, hf_tokenizer, name, data)
        assert f"{name}: {where} not valid UTF-8 (" in line, line
        assert line.endswith("re-encode the file as UTF-8 or drop the line"), line
        assert "not valid JSON" not in line
    assert "UTF-16 byte-order mark" in line, line


def test_a_byte_order_mark_alone_on_the_first_line_is_a_blank_line(tmp_path, hf_tokenizer):
    """A UTF-8 byte-order mark then a newline: a blank first line, skipped as the docs say
    (it was 'line 1: not valid JSON'); before a JSON object it is no part of it."""
    body = b'{"text": "a"}\n{"text": "b"}\n'
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf\n" + body)
    (tmp_path / "bom2.jsonl").write_bytes(b"\xef\xbb\xbf" + body)
    for name in ("bom.jsonl", "bom2.jsonl"):
        res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, tmp_path / name,
                      tmp_path / f"t-{name}-out"])
        assert res.exit_code == 0, res.output
        assert read_manifest(tmp_path / f"t-{name}-out").totals.docs_in == 2


def test_a_line_of_another_json_value_is_named_by_json_s_word(tmp_path, hf_tokenizer):
    """A line holding null, a number, a string, a boolean or an array: named so, not by the
    Python type it parses to ('a JSON NoneType', 'a JSON int')."""
    for value, word in (("null", "null"), ("3", "number"), ("2.5", "number"), ('"t"', "string"),
                        ("true", "boolean"), ('["t"]', "array")):
        line = _refused_jsonl(tmp_path, hf_tokenizer, "v.jsonl",
                              f'{{"text": "a"}}\n{value}\n'.encode())
        assert f"v.jsonl: line 2: a JSON {word}, not an object;" in line, line


def test_an_input_given_twice_to_tokenize_would_be_tokenized_twice(tmp_path, hf_tokenizer):
    """The same INPUT twice: tokenize says its documents would be tokenized twice (it said
    packed, the word of pack, which still says it)."""
    src = write_jsonl(tmp_path / "a.jsonl", ["x"])
    line = _one_error(invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, src, src,
                              tmp_path / "o"]))
    assert "its documents would be tokenized twice: list each input once" in line, line
    ids = tmp_path / "x.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2]]}), ids)
    line = _one_error(invoke(["pack", "-q", "-c", 8, ids, ids, tmp_path / "p"]))
    assert "its documents would be packed twice" in line, line


def test_a_binary_text_column_is_named_binary_with_its_cast(tmp_path, hf_tokenizer):
    """Parquet text stored as binary (bytes, not string): named binary, with the cast to
    string; not 'pass --text-column NAME', which names the right column already."""
    for typ in (pa.binary(), pa.large_binary()):
        pq.write_table(pa.table({"text": pa.array([b"a", b"b"], typ)}), tmp_path / "b.parquet")
        line = _one_error(invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer,
                                  tmp_path / "b.parquet", tmp_path / "o"]))
        assert f"b.parquet: column 'text' has type {typ}: bytes, not text; cast it to string" \
            in line, line
        assert "--text-column" not in line, line


def test_a_kept_json_value_keeps_its_characters(tmp_path, hf_tokenizer):
    """--keep-column of a JSON object or list is kept as its JSON text with its characters as
    they are ('日本', not '\\u65e5\\u672c'); a lone surrogate inside one is still refused."""
    src = tmp_path / "k.jsonl"
    src.write_text(json.dumps({"text": "a", "meta": {"lang": "日本", "n": [1, "é"]}},
                              ensure_ascii=False) + "\n", encoding="utf-8")
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "meta", src,
                  tmp_path / "o"])
    assert res.exit_code == 0, res.output
    assert pq.read_table(tmp_path / "o").column("meta").to_pylist() == [
        '{"lang": "日本", "n": [1, "é"]}']
    src.write_text('{"text": "a", "meta": {"x": ["\\ud800"]}}\n')
    line = _one_error(invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column",
                              "meta", src, tmp_path / "o2"]))
    assert "line 1: 'meta' holds a lone surrogate (\\ud800)" in line, line


def _gapped_word_level(path):
    """A tokenizer.json whose ids skip numbers: 3 entries, ids 0, 2 and 7."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 2, "world": 7}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


@pytest.mark.parametrize("case", ["bos-eos-above-the-ranks", "vocabulary-with-gaps",
                                  "kept-list-column"])
def test_a_valid_tokenized_corpus_packs_and_verifies(tmp_path, tokenizer_files, case):
    """No id of a tokenize output is held to the vocabulary size its manifest records: a BOS
    and EOS added by id above the ranks of a BPE file naming no special tokens (Llama 3's
    tokenizer.model and --append-eos 128001), a tokenizer.json whose ids skip numbers (its size
    is its largest id + 1, not its entry count), and a kept list column packed with --column
    (ids the tokenizer never wrote) all pack, and verify --data-only passes the output."""
    src = tmp_path / "t.parquet"
    texts = ["hello world", "world hello hello", "hello", "the world"]
    pq.write_table(pa.table({"text": texts, "other": pa.array(
        [[5000, 1], [70000], [2, 3, 4], [123456]], pa.list_(pa.int32()))}), src)
    tok, out, column = tmp_path / "tok", tmp_path / "packed", []
    if case == "bos-eos-above-the-ranks":
        model = tmp_path / "tokenizer.model"
        model.write_bytes(tokenizer_files["tiktoken"][0].read_bytes())
        n = len(tiny_ranks())
        args = ["--tokenizer", model, "--tokenizer-pattern", r"\p{L}+|\s+|.",
                "--prepend-bos", n, "--append-eos", n + 1]
        want = n + 1
    elif case == "vocabulary-with-gaps":
        args = ["--tokenizer", _gapped_word_level(tmp_path / "tokenizer.json")]
        want = 7
    else:
        args = ["--tokenizer", tokenizer_files["tokenizers"][0], "--keep-column", "other"]
        column, want = ["--column", "other"], 123456
    res = invoke(["tokenize", "-q", *args, src, tok])
    assert res.exit_code == 0, res.output
    res = invoke(["pack", "-q", "-c", 16, *column, tok, out])
    assert res.exit_code == 0, res.output
    assert want in [i for r in read_output(out)[0] for i in r["input_ids"]]
    res = invoke(["verify", "--data-only", out])
    assert res.exit_code == 0, res.output
    size = read_manifest(out).tokenized.tokenizer.vocab_size
    if case == "vocabulary-with-gaps":  # ids 0 .. 7, not the 3 entries
        assert size == 8
    elif case == "bos-eos-above-the-ranks":  # the file does not say how many ids the model has
        assert size is None


@pytest.mark.parametrize("where", ["local", "store"])
def test_a_failed_overwrite_leaves_the_finished_output_as_it_was(tmp_path, hf_tokenizer, where,
                                                                request):
    """--overwrite of a finished tokenize output whose new input holds a bad line after a
    first shard was written: the old output stays byte for byte (no marker, no pending shard
    left) and readable by pack; it was deleted before the new input had been read."""
    src = tmp_path / "in"
    src.mkdir()
    write_jsonl(src / "a.jsonl", TEXTS)
    if where == "store":
        fs, bucket = request.getfixturevalue("s3")
        out, tree = f"s3://{bucket}/tok", (lambda: hash_store_tree(fs, f"{bucket}/tok"))
    else:
        out, tree = tmp_path / "out", (lambda: hash_tree(tmp_path / "out"))
    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, "--rows-per-shard", 10]
    assert invoke([*args, src, out]).exit_code == 0
    before, m = tree(), read_manifest(out)
    (src / "b.jsonl").write_text('{"text": "x"}\n' * 12 + '{"text": null}\n')
    res = invoke([*args, "--overwrite", src, out])
    assert res.exit_code == 1 and "line 13: 'text' is null" in res.output, res.output
    assert tree() == before
    assert read_manifest(out) == m
    assert invoke(["pack", "-q", "-c", 64, out, tmp_path / "p"]).exit_code == 0


def test_an_interrupted_overwrite_keeps_the_finished_output_readable_and_resumes(
        tmp_path, hf_tokenizer, monkeypatch):
    """Ctrl-C in an --overwrite of a finished output after its first new shard: the old
    output is untouched and readable (its files as they were; the new run's pending shard and
    marker beside them, which no reader takes), the message says so, and the same command
    rerun keeps that shard and ends with the bytes of an undisturbed run."""
    from packtool.text import run

    src = tmp_path / "in"
    src.mkdir()
    write_jsonl(src / "a.jsonl", TEXTS[:20])
    out = tmp_path / "out"
    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, "--rows-per-shard", 10]
    assert invoke([*args, src, out]).exit_code == 0
    before, m = hash_tree(out), read_manifest(out)
    write_jsonl(src / "b.jsonl", TEXTS)
    new = [*args, "--overwrite", src, out]
    assert invoke([*args, src, tmp_path / "whole"]).exit_code == 0
    real = _stop_publishing_at(monkeypatch, 2)
    res = invoke(new)
    assert res.exit_code == 130
    assert res.output.strip() == (
        f"Error: interrupted: {out} still holds its earlier finished tokenize run, untouched; "
        "kept for the rerun: 1 finished shard; rerun the same command to resume and finish it")
    monkeypatch.setattr(run, "publish_shard", real)
    assert {k: v for k, v in hash_tree(out).items() if k in before} == before
    assert read_manifest(out) == m
    assert invoke(["pack", "-q", "-c", 64, out, tmp_path / "p"]).exit_code == 0
    res = invoke(["tokenize", "--json", *new[2:]])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["shards_reused"] == 1
    assert hash_tree(out) == hash_tree(tmp_path / "whole")


def test_a_rerun_after_an_input_was_touched_names_the_tokenize_run(tmp_path, hf_tokenizer):
    """Tokenize, touch the input, rerun: the refusal says the file was touched since the
    tokenize run (it said "since the pack")."""
    import os

    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    out = tmp_path / "out"
    args = ["tokenize", "-q", "--tokenizer", hf_tokenizer, src, out]
    assert invoke(args).exit_code == 0
    later = (out / MANIFEST_NAME).stat().st_mtime + 60
    os.utime(src, (later, later))
    res = invoke(args)
    assert res.exit_code == 1, res.output
    assert "(1 file touched or changed in place since the tokenize run, same size" \
        in res.output, res.output
    assert "pack" not in res.output.split("holds a finished tokenize run of other inputs")[1], \
        res.output


def test_kept_json_numbers_keep_their_characters_and_nan_is_refused(tmp_path, hf_tokenizer):
    """A kept JSON Lines value is its JSON with its characters as they are, numbers included
    (nested ones too): 1e400 stays 1e400 (it was 'Infinity', not JSON), 1.0e2 stays 1.0e2 (it
    was '100.0'), long digits are not rounded. NaN and Infinity, which are not JSON, are
    refused in one line naming the file, the line and the fix, in the text key too (it was
    called a number); in a key neither read nor kept they are left alone."""
    lines = ['{"text": "a", "m": 1e400}', '{"text": "b", "m": 3.14159265358979323846}',
             '{"text": "c", "m": 1.0e2}', '{"text": "d", "m": 12345678901234567890.5}',
             '{"text": "e", "m": {"x": [1.0e2, -0, 7, 2E-3]}, "other": NaN}',
             '{"text": "f", "m": 12}']
    src = tmp_path / "a.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "m", src, out])
    assert res.exit_code == 0, res.output
    [shard] = sorted(out.glob("part-*.parquet"))
    assert pq.read_table(shard).column("m").to_pylist() == [
        "1e400", "3.14159265358979323846", "1.0e2", "12345678901234567890.5",
        '{"x": [1.0e2, -0, 7, 2E-3]}', "12"]
    for n, (line, key) in enumerate([('{"text": "a", "m": NaN}', "'m'"),
                                     ('{"text": "a", "m": [1, -Infinity]}', "'m'"),
                                     ('{"text": Infinity}', "'text'")]):
        bad = tmp_path / f"bad{n}.jsonl"
        bad.write_text('{"text": "ok", "m": 1}\n' + line + "\n")
        res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--keep-column", "m", bad,
                      tmp_path / f"o{n}"])
        lit = "NaN" if "NaN" in line else ("-Infinity" if "-Inf" in line else "Infinity")
        assert res.exit_code == 1 and res.output.strip() == (
            f"Error: {bad}: line 2: {key} holds {lit}, which is not JSON (Python's json module "
            "writes it for a float that is not a number); write null or a string there, or "
            "drop the line"), res.output
    for n, (line, said) in enumerate([('{"text": 1.5e3}', "'text' is a number, not a string"),
                                      ('{"text": -0}', "'text' is an integer, not a string"),
                                      ("2.5", "a JSON number, not an object")]):
        bad = tmp_path / f"num{n}.jsonl"
        bad.write_text(line + "\n")
        res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, bad, tmp_path / f"n{n}"])
        assert res.exit_code == 1 and f"line 1: {said}" in res.output, res.output


def test_utf16_without_a_mark_and_a_mark_in_a_later_line_are_named(tmp_path, hf_tokenizer):
    """A UTF-16 file without its byte-order mark (NUL bytes between the characters) is said to
    look UTF-16, with the command that converts it; a UTF-8 byte-order mark at the start of a
    later line (files joined with cat) is named as such, with the fix. Both got a raw JSON
    error."""
    body = '{"text": "hello"}\n{"text": "world"}\n'
    for enc in ("utf-16-le", "utf-16-be"):
        src = tmp_path / f"{enc}.jsonl"
        src.write_bytes(body.encode(enc))
        res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, src, tmp_path / enc])
        assert res.exit_code == 1 and res.output.strip() == (
            f"Error: {src}: line 1: looks like UTF-16 text without a byte-order mark (NUL bytes "
            "between its characters), not UTF-8; convert it: iconv -f UTF-16"
            f"{enc[-2:].upper()} -t UTF-8 {src} > {tmp_path / enc}.utf8.jsonl"), res.output
    joined = tmp_path / "joined.jsonl"
    joined.write_bytes(b"\xef\xbb\xbf" + body.encode() + b"\xef\xbb\xbf" + body.encode())
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, joined, tmp_path / "j"])
    assert res.exit_code == 1 and res.output.strip() == (
        f"Error: {joined}: line 3: begins with a UTF-8 byte-order mark in the middle of the "
        "file (files joined with cat, each with its mark); remove the marks: sed -i "
        f"'s/^\\xEF\\xBB\\xBF//' {joined}"), res.output


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_given_as_text_is_refused_without_opening_it(tmp_path, hf_tokenizer):
    """A FIFO as INPUT (or a shell's <(zcat x)): opening it waits for a writer forever, deaf
    to Ctrl-C; tokenize refuses it in one line before any open. In a subprocess with a
    timeout, so that a hang fails this test instead of the suite."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    res = subprocess.run([sys.executable, "-m", "packtool", "tokenize", "-q", "--tokenizer",
                          str(hf_tokenizer), str(fifo), str(tmp_path / "tok")],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines() == [
        res.stderr.strip()], "one line"
    assert f"Error: {fifo}: not a regular file (a named pipe); pass a file" in res.stderr
    assert not (tmp_path / "tok").exists()


def test_a_full_disk_while_tokenizing_is_said_in_tokenize_words(tmp_path, hf_tokenizer,
                                                                monkeypatch):
    """ENOSPC while tokenize publishes a shard: one line naming the tokenize run and the bytes
    free, never a pack's scratch and shards of 0 bytes it did not count; the finished shards
    are kept for the rerun."""
    import errno
    import shutil as sh

    from packtool.text import run

    real, calls = run.publish_shard, []
    usage = sh.disk_usage

    def full(*a):
        calls.append(a)
        if len(calls) == 3:
            monkeypatch.setattr("packtool.output.shutil.disk_usage",
                                lambda p: usage(p)._replace(free=4096))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a)

    monkeypatch.setattr(run, "publish_shard", full)
    src = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    out = tmp_path / "tok"
    res = invoke(["tokenize", "-q", "--tokenizer", hf_tokenizer, "--rows-per-shard", 10, src,
                  out])
    assert res.exit_code == 1, res.output
    assert res.output.strip() == (
        f"Error: {out}: no space left on device: this tokenize run filled the disk while "
        "writing OUTPUT (4,096 bytes free); free space or choose another OUTPUT (the finished "
        "shards are kept (2): rerun the same command to finish)"), res.output
