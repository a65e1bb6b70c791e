"""Input discovery: what a directory of tokenized data contributes, and what it must not.

Spark/Hadoop ``_temporary`` folders and hidden folders hold copies of documents; an earlier
packed OUTPUT holds padding that would become tokens; a hard link is the same file under a
second name. Each of these would silently change the corpus, so each is skipped or refused.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import check_output, invoke, read_output, write_docs, write_table_as
from packtool.formats.manifest import MANIFEST_NAME
from packtool.errors import InputError
from packtool.formats.reader import PACKED_COLUMNS, discover
from packtool.pipeline.read import plan_reads


def _rels(d):
    return [f.rel for f in d.files]


def test_hidden_and_underscore_directories_are_skipped_at_every_level(tmp_path):
    """Documents under _temporary/ or .ipynb_checkpoints/ are duplicates, never input."""
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2]])
    write_docs(src / "sub" / "b.parquet", [[3]])
    write_docs(src / "_temporary" / "0" / "a.parquet", [[1, 2]])
    write_docs(src / ".ipynb_checkpoints" / "a.parquet", [[1, 2]])
    write_docs(src / "sub" / "_temporary" / "b.parquet", [[3]])
    write_docs(src / "sub" / ".hidden" / "c.parquet", [[4]])
    write_docs(src / "sub" / "_c.parquet", [[5]])
    d = discover([src])
    assert _rels(d) == ["a.parquet", "sub/b.parquet"]
    assert len(d.skipped) == 5
    assert "skipped 5" in d.skipped_note()


def test_pack_summary_names_what_was_skipped(tmp_path):
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2, 3]])
    write_docs(src / "_temporary" / "a.parquet", [[1, 2, 3]])
    out = tmp_path / "out"
    res = invoke(["pack", "--capacity", 4, src, out])
    assert res.exit_code == 0, res.output
    assert "skipped 1" in res.output and "_temporary" in res.output
    _, manifest = read_output(out)
    assert manifest.totals.docs_in == 1


def test_json_lists_what_was_not_read_also_with_quiet(tmp_path):
    """pack -q --json (what scripts run) printed inputs_not_read [] and no notes: -q turned the
    discovery summary off, --json must still hold it."""
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2, 3]])
    write_docs(src / "_temporary" / "x.parquet", [[1, 2, 3]])
    (src / "_SUCCESS").write_text("")
    (src / "README.md").write_text("notes")
    got = []
    for quiet in ([], ["-q"]):
        res = invoke(["pack", *quiet, "--json", "--overwrite", "--capacity", 4, src,
                      tmp_path / "out"])
        assert res.exit_code == 0, res.output
        got.append(json.loads(res.stdout))
    assert got[0]["inputs_not_read"] and got[1]["inputs_not_read"] == got[0]["inputs_not_read"]
    assert got[1]["inputs_skipped"] == got[0]["inputs_skipped"] != ""


def test_symlinked_directory_is_followed(tmp_path):
    data = tmp_path / "data"
    write_docs(data / "x.parquet", [[7, 8, 9]])
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2]])
    os.symlink(data, src / "linked")
    assert _rels(discover([src])) == ["a.parquet", "linked/x.parquet"]


def test_symlink_loop_is_skipped_not_followed_forever(tmp_path):
    src = tmp_path / "in"
    write_docs(src / "sub" / "a.parquet", [[1, 2]])
    os.symlink(src, src / "sub" / "up")
    d = discover([src])
    assert _rels(d) == ["sub/a.parquet"]
    assert any("link loop" in s for s in d.skipped)


def test_symlinked_file_is_followed(tmp_path):
    f = write_docs(tmp_path / "data" / "x.parquet", [[7, 8]])
    src = tmp_path / "in"
    src.mkdir()
    os.symlink(f, src / "x.parquet")
    assert _rels(discover([src])) == ["x.parquet"]


@pytest.mark.parametrize("how", ["hardlink", "symlink"])
def test_same_file_under_two_names_is_read_once_at_its_own_path(tmp_path, how):
    """A hard link or symbolic link to a shard already in INPUT would pack it twice: it is read
    once, where INPUT holds it (a link named to sort first does not move it), and the other
    name is reported."""
    src = tmp_path / "in"
    b = write_docs(src / "b.parquet", [[1, 2]])
    write_docs(src / "c.parquet", [[3]])
    (os.link if how == "hardlink" else os.symlink)(b, src / "a.parquet")
    d = discover([src])
    want = ["a.parquet", "c.parquet"] if how == "hardlink" else ["b.parquet", "c.parquet"]
    assert _rels(d) == want  # two hard links are both "own paths": the first in order
    other = "b.parquet" if how == "hardlink" else "a.parquet"
    assert d.skipped == [f"{src / other} (another name of a file read at {want[0]})"]
    out = tmp_path / "out"
    res = invoke(["pack", "--capacity", 4, src, out])
    assert res.exit_code == 0, res.output
    assert "another name of a file" in res.output
    assert read_output(out)[1].totals.docs_in == 2


def test_a_folder_linked_twice_inside_input_is_read_once(tmp_path):
    """``latest -> v3`` beside ``v3/``: v3 is read once at its own place; two links to one
    folder elsewhere: read once, at the link that sorts first."""
    src = tmp_path / "in"
    write_docs(src / "v3" / "x.parquet", [[1, 2]])
    os.symlink("v3", src / "latest")
    elsewhere = tmp_path / "shards"
    write_docs(elsewhere / "y.parquet", [[3]])
    os.symlink(elsewhere, src / "s2")
    os.symlink(elsewhere, src / "s1")
    d = discover([src])
    assert _rels(d) == ["s1/y.parquet", "v3/x.parquet"]
    assert sorted(d.skipped) == [f"{src / 'latest'} (another name of a folder read at v3/)",
                                 f"{src / 's2'} (another name of a folder read at s1/)"]


@pytest.mark.parametrize("target", ["..", "../..", "../../.."])
def test_a_link_to_input_or_one_of_its_parents_is_never_entered(tmp_path, target):
    """``in/loop/up -> ..`` (INPUT) or ``../..`` (INPUT's parent): entering it would read the
    parent's other folders (a notes file, another OUTPUT) or INPUT again; a loop, reported."""
    top = tmp_path / "work"
    src = top / "in"
    write_docs(src / "loop" / "x.parquet", [[1, 2]])
    (top / "foreign").mkdir(parents=True)
    (top / "foreign" / "notes.txt").write_text("not data\n")
    write_docs(top / "other_out" / "part-00000.parquet", [[9]])
    (top / "other_out" / MANIFEST_NAME).write_text("x")
    os.symlink(target, src / "loop" / "up")
    d = discover([src])
    assert _rels(d) == ["loop/x.parquet"]
    assert d.skipped == [f"{src / 'loop' / 'up'} (link loop)"]
    out = tmp_path / "out"
    res = invoke(["pack", "--capacity", 4, src, out])
    assert res.exit_code == 0 and "link loop" in res.output, res.output


def test_a_link_out_of_input_is_read_but_not_the_way_back_from_there(tmp_path):
    """Shards kept elsewhere are read through a link; a link there to the target's own parent
    (which holds other things) is a loop too."""
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1]])
    shards = tmp_path / "store" / "shards"
    write_docs(shards / "y.parquet", [[2, 3]])
    (tmp_path / "store" / "notes.txt").write_text("not data\n")
    os.symlink("..", shards / "up")
    os.symlink(shards, src / "linked")
    d = discover([src])
    assert _rels(d) == ["a.parquet", "linked/y.parquet"]
    assert d.skipped == [f"{src / 'linked' / 'up'} (link loop)"]


def test_a_broken_link_is_refused_in_one_line_unless_hidden(tmp_path):
    """A link to nothing may be a shard that went missing: refused, named with its target;
    the filesystem listing alone would drop it silently."""
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2]])
    os.symlink(tmp_path / "gone.parquet", src / "_old.parquet")
    assert _rels(discover([src])) == ["a.parquet"]  # hidden: skipped like any `_` entry
    os.symlink(tmp_path / "gone.parquet", src / "b.parquet")
    with pytest.raises(InputError, match=r"in/b\.parquet: a broken symbolic link \(to .*gone"):
        discover([src])
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--capacity", 4, src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "broken symbolic link" in res.output and not out.exists()
    with pytest.raises(InputError, match="b.parquet: a broken symbolic link"):
        discover([src / "b.parquet"])
    # every broken link of the folder in the one line, not one a run
    for k in range(8):
        os.symlink(tmp_path / f"gone{k}", src / f"c{k}.parquet")
    with pytest.raises(InputError) as err:
        discover([src])
    line = str(err.value)
    assert "\n" not in line and line.endswith("fix the links or remove them from INPUT")
    named = [f"in/{n}.parquet: a broken symbolic link" for n in ["b"] + [f"c{k}" for k in range(5)]]
    assert all(n in line for n in named), line
    assert "c5.parquet" not in line and "and 3 more" in line


def test_an_input_given_through_a_link_never_enters_its_parents_as_written(tmp_path):
    """INPUT ``t5/in -> t5real`` and ``t5real/up -> t5``: ``up`` leads to INPUT's parent as
    the user wrote it (not a parent of the real folder); entering it read ``t5/side/`` and the
    pack took 400 documents for 200. A loop, reported."""
    write_docs(tmp_path / "t5" / "side" / "other.parquet", [[7, 8]] * 3)
    real = tmp_path / "t5real"
    write_docs(real / "a.parquet", [[1, 2]])
    os.symlink(real, tmp_path / "t5" / "in")
    os.symlink(tmp_path / "t5", real / "up")
    d = discover([tmp_path / "t5" / "in"])
    assert _rels(d) == ["a.parquet"]
    assert d.skipped == [f"{tmp_path / 't5' / 'in' / 'up'} (link loop)"]


def test_a_link_inside_input_to_the_pack_s_own_output_is_refused_before_writing(tmp_path):
    """``in/outlink -> out`` with OUTPUT ``out``: the first pack read an empty folder, and
    every later run (the same command, a resume) found its own output inside INPUT. Refused
    at once, naming the link and the output; nothing written. Also the held-out output, and
    a link to a folder that holds OUTPUT."""
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2, 3]] * 4)
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(out, src / "outlink")
    res = invoke(["pack", "-q", "--capacity", 4, src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert f"{src / 'outlink'}: leads to OUTPUT {out} through a symbolic link" in res.output, \
        res.output
    assert list(out.iterdir()) == []
    os.unlink(src / "outlink")
    held = tmp_path / "box" / "held"
    held.mkdir(parents=True)
    os.symlink(tmp_path / "box", src / "boxlink")
    res = invoke(["pack", "-q", "--capacity", 4, "--holdout", 0.3, "--holdout-output", held,
                  src, tmp_path / "out2"])
    assert res.exit_code == 1 and "leads to --holdout-output" in res.output, res.output
    assert not (tmp_path / "out2").exists() and list(held.iterdir()) == []


def test_a_loop_of_links_is_named_a_loop_not_a_link_to_nothing(tmp_path):
    """``cy1 -> cy2 -> cy1``: both names exist; the line says they loop."""
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2]])
    os.symlink("cy2", src / "cy1")
    os.symlink("cy1", src / "cy2")
    with pytest.raises(InputError, match=r"cy1: a loop of symbolic links \(cy1 -> cy2 -> cy1"):
        discover([src])
    with pytest.raises(InputError, match="a loop of symbolic links"):
        discover([src / "cy1"])


def _packed_output(tmp_path):
    src = write_docs(tmp_path / "raw" / "a.parquet", [[1, 2, 3], [4, 5]])
    out = tmp_path / "packed"
    res = invoke(["pack", "-q", "--capacity", 4, src, out])
    assert res.exit_code == 0, res.output
    return out


def test_packed_output_as_input_is_refused(tmp_path):
    packed = _packed_output(tmp_path)
    for given in (packed, packed / "part-00000.parquet"):
        out = tmp_path / "again"
        res = invoke(["pack", "-q", "--capacity", 4, given, out])
        assert res.exit_code == 1, res.output
        assert "packtool output" in res.output and str(given) in res.output
        assert not out.exists()


def test_packed_output_inside_input_is_refused(tmp_path):
    packed = _packed_output(tmp_path)
    src = tmp_path / "raw"
    os.rename(packed, src / "old_pack")
    with pytest.raises(InputError, match=r"old_pack: is a packtool output \(\.packtool-manifest"):
        discover([src])


@pytest.mark.parametrize("column", PACKED_COLUMNS)
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_another_tool_s_packed_rows_are_refused_from_the_footer(tmp_path, column, fmt):
    """Rows that already hold several documents (TRL ``seq_lengths``, ``position_ids`` that
    restart per document, ``cu_seqlens``, ...) read as one document each would join them: the
    column is named from the schema, before any data is read and before OUTPUT exists."""
    table = pa.table({"input_ids": pa.array([[1, 2, 3, 9], [4, 5, 6, 7, 8]], pa.list_(pa.int32())),
                      column: pa.array([[3, 1], [2, 3]], pa.list_(pa.int32()))})
    src = tmp_path / "in" / f"packed.{fmt}"
    src.parent.mkdir()
    write_table_as(table, src, fmt)
    with pytest.raises(InputError, match=rf"packed\.{fmt}: has a '{column}' column, which "
                       r"marks rows another tool packed .*join its documents.*refused from the "
                       rf"schema, its values unread; pack the unpacked documents.*drop the "
                       rf"'{column}' column"):
        plan_reads(discover([src]).files, "input_ids")  # the footers only
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--capacity", 8, src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert str(src) in res.output and column in res.output and not out.exists()
    pq.write_table(table.drop_columns([column]), tmp_path / "fixed.parquet")  # the fix named
    assert invoke(["pack", "-q", "--capacity", 8, tmp_path / "fixed.parquet",
                   tmp_path / "ok"]).exit_code == 0


def test_a_packtool_output_re_saved_without_its_metadata_is_refused(tmp_path):
    """polars, pandas and ``datasets.to_parquet`` drop the ``packtool.*`` schema metadata and
    leave the manifest behind: the packed columns still say what the file is."""
    packed = _packed_output(tmp_path)
    table = pq.read_table(packed / "part-00000.parquet")
    resaved = tmp_path / "resaved.parquet"
    pq.write_table(table.replace_schema_metadata(None), resaved)
    out = tmp_path / "again"
    res = invoke(["pack", "-q", "--capacity", 8, resaved, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "resaved.parquet: is a packtool output" in res.output and "re-save" in res.output
    assert not out.exists()


@pytest.mark.parametrize("column,values", [
    ("position_ids", [[0, 1, 2], [0, 1, 2]]),  # positions that never restart: one document a row
    ("segment_ids", [[1, 1, 1], [1, 1, 1]]), ("seq_idx", [[0, 0, 0], [0, 0, 0]]),
    ("seq_lengths", [[3], [3]]), ("cu_seqlens", [[0, 3], [0, 3]]),
    ("cu_seq_lens", [[0, 3], [0, 3]]), ("seq_start_id", [[0], [0]])])
def test_a_packed_rows_column_is_refused_by_its_name_never_claiming_what_was_not_read(
        tmp_path, column, values):
    """A ``position_ids`` column of 0, 1, 2 in every row holds one document a row, yet the
    refusal said "each row already holds several documents": the column is judged by its name
    alone (its values are never read), so the message says what the column marks and that its
    values were not read, and the fix it names (drop the column) packs the file."""
    table = pa.table({"input_ids": pa.array([[5, 6, 7], [8, 9, 10]], pa.list_(pa.int32())),
                      column: pa.array(values, pa.list_(pa.int32()))})
    src = tmp_path / "one_doc_a_row.parquet"
    pq.write_table(table, src)
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--capacity", 8, src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    line = res.output.strip()
    assert f"one_doc_a_row.parquet: has a {column!r} column, which marks rows another tool " \
        "packed" in line, line
    assert "its values unread" in line and f"drop the {column!r} column" in line
    assert "several documents" not in line and "holds packed rows" not in line
    assert not out.exists()
    pq.write_table(table.drop_columns([column]), tmp_path / "dropped.parquet")
    res = invoke(["pack", "-q", "--capacity", 8, tmp_path / "dropped.parquet", tmp_path / "ok"])
    assert res.exit_code == 0, res.output
    check_output(read_output(tmp_path / "ok")[0], [[5, 6, 7], [8, 9, 10]], 8, labels="none")


def test_an_attention_mask_that_numbers_packed_documents_is_refused(tmp_path):
    """LLaMA-Factory's ``neat_packing`` writes 1, 2, 3 ... per document of a packed row in
    ``attention_mask``; read as "nonzero = real token" its documents would be joined."""
    src = tmp_path / "neat.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2, 3, 9], [4, 5]],
                             "attention_mask": [[1, 1, 1, 2], [1, 1]]}), src)
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--capacity", 8, src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "neat.parquet: row 0" in res.output and "'attention_mask' holds 2" in res.output
    assert "packed row" in res.output and not out.exists()


def test_interrupted_packed_output_inside_input_is_refused(tmp_path):
    """No manifest yet, but the in-progress marker says what the directory is."""
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2]])
    write_docs(src / "half" / "part-00000.parquet", [[1, 2]])
    (src / "half" / ".packtool-in-progress.json").write_text(json.dumps({"fingerprint": "x"}))
    with pytest.raises(InputError, match="half: is a packtool output"):
        discover([src])


def test_unrelated_manifest_json_is_not_mistaken_for_packed_output(tmp_path):
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2]])
    (src / "manifest.json").write_text(json.dumps({"source": "crawl"}))
    (src / MANIFEST_NAME).write_text(json.dumps({"packtool_version": "0"}))  # not Parquet
    d = discover([src], skip_unsupported=True)  # manifest.json is no data: not read, reported
    assert _rels(d) == ["a.parquet"]
    assert any("manifest.json (unsupported format)" in s for s in d.skipped)


def test_sorted_relative_path_order_across_levels(tmp_path):
    """The global document index is the sorted relative-path order, not a walk order."""
    src = tmp_path / "in"
    for rel in ("a/x.parquet", "a-b/y.parquet", "a.parquet", "b.parquet"):
        write_docs(src / rel, [[1]])
    rels = _rels(discover([src]))
    assert rels == sorted(rels)


def test_unsupported_file_inside_a_folder_is_refused_in_one_line(tmp_path):
    """A docs.jsonl next to Parquet shards would silently not be packed: refused, named, with
    the option that accepts it; OUTPUT is not created."""
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2, 3]])
    (src / "sub").mkdir()
    (src / "sub" / "docs.jsonl").write_text('{"input_ids": [4, 5]}\n')
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--capacity", 4, src, out])
    assert res.exit_code == 1, res.output
    assert res.output.count("\n") == 1, res.output
    for word in ("sub/docs.jsonl", "unsupported format", "--skip-unsupported", "Parquet"):
        assert word in res.output
    assert not out.exists()
    res = invoke(["compare", "-c", 4, src])
    assert res.exit_code == 1 and "sub/docs.jsonl" in res.output, res.output


@pytest.mark.parametrize("empty", [False, True])
def test_a_refused_folder_is_named_as_the_user_typed_it(tmp_path, monkeypatch, empty):
    """A relative INPUT stays relative in the message (as every other input error names it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    if not empty:
        write_docs(tmp_path / "in" / "a.parquet", [[1, 2, 3]])
    (tmp_path / "in" / "notes.txt").write_text("hi\n")
    res = invoke(["pack", "-q", "--capacity", 4, "in", "out"])
    assert res.exit_code == 1 and res.output.startswith("Error: in: "), res.output
    assert str(tmp_path) not in res.output


def test_skip_unsupported_packs_the_rest_and_reports_every_file_not_read(tmp_path):
    src = tmp_path / "in"
    write_docs(src / "a.parquet", [[1, 2, 3]])
    others = [f"x{i}.jsonl" for i in range(5)]
    for name in others:
        (src / name).write_text("{}\n")
    (src / "README.md").write_text("# my corpus\n")  # documentation: reported, never refused
    write_docs(src / "_tmp" / "b.parquet", [[1]])
    out = tmp_path / "out"
    res = invoke(["pack", "--capacity", 4, "--skip-unsupported", src, out])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "INPUT:" in ln)
    assert "skipped 7" in line and "5 unsupported format: " in line
    assert "1 documentation: " in line and "_tmp" in line
    res = invoke(["pack", "--json", "--capacity", 4, "--skip-unsupported", "--overwrite", src,
                  tmp_path / "out2"])
    import json as _json

    summary = _json.loads(res.output)
    listed = " ".join(summary["inputs_not_read"])
    assert all(str(src / n) in listed for n in others + ["README.md", "_tmp"])


def test_files_a_save_to_disk_folder_does_not_list_are_reported(tmp_path):
    """``state.json`` defines the dataset: a stray cache file beside it is not read, and the
    summary says so."""
    import pyarrow as pa

    hf = tmp_path / "hf"
    hf.mkdir()
    table = pa.table({"input_ids": pa.array([[1, 2], [3]], pa.list_(pa.int32()))})
    for name in ("data-00000-of-00001.arrow", "cache-1234.arrow"):
        with pa.ipc.new_stream(str(hf / name), table.schema) as w:
            w.write_table(table)
    (hf / "dataset_info.json").write_text("{}")
    (hf / "state.json").write_text(json.dumps(
        {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    d = discover([hf])
    assert _rels(d) == ["data-00000-of-00001.arrow"]
    assert d.skipped == [f"{hf / 'cache-1234.arrow'} (not listed in state.json)"]
    res = invoke(["pack", "--capacity", 4, hf, tmp_path / "out"])
    assert res.exit_code == 0, res.output
    assert "cache-1234.arrow" in res.output and "not listed in state.json" in res.output


def test_a_file_given_itself_and_inside_its_directory_names_both_ways(tmp_path):
    """INPUT dir/ and dir/a.parquet: the message says how the file was reached twice, not the
    same path twice."""
    src = tmp_path / "in"
    a = write_docs(src / "a.parquet", [[1, 2]])
    with pytest.raises(InputError) as err:
        discover([src, a])
    assert str(err.value).startswith(f"{a}: given twice (inside INPUT {src} and as INPUT {a});")
