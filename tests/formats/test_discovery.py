"""Input discovery: what a directory of tokenized data contributes, and what it must not.

Spark/Hadoop ``_temporary`` folders and hidden folders hold copies of documents; an earlier
packed OUTPUT holds padding that would become tokens; a hard link is the same file under a
second name. Each of these would silently change the corpus, so each is skipped or refused.
"""

from __future__ import annotations

import json
import os

import pytest

from packcheck import invoke, read_output, write_docs
from packtool.formats.manifest import MANIFEST_NAME
from packtool.errors import InputError
from packtool.formats.reader import discover


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
def test_same_file_under_two_names_is_refused(tmp_path, how):
    """A hard link or symbolic link to a shard already in INPUT would pack it twice."""
    src = tmp_path / "in"
    a = write_docs(src / "a.parquet", [[1, 2]])
    (os.link if how == "hardlink" else os.symlink)(a, src / "b.parquet")
    with pytest.raises(InputError, match="given twice"):
        discover([src])
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "--capacity", 4, src, out])
    assert res.exit_code == 1 and "given twice" in res.output
    assert not out.exists()


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
    assert _rels(discover([src])) == ["a.parquet"]


def test_sorted_relative_path_order_across_levels(tmp_path):
    """The global document index is the sorted relative-path order, not a walk order."""
    src = tmp_path / "in"
    for rel in ("a/x.parquet", "a-b/y.parquet", "a.parquet", "b.parquet"):
        write_docs(src / rel, [[1]])
    rels = _rels(discover([src]))
    assert rels == sorted(rels)
