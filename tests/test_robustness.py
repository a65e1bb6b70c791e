"""Every failure leaves through the one cleanup path of packtool.output: a late bad value in any
window, a full disk or an I/O error at several write points, a failed engine task. Afterwards
OUTPUT is as it was before the run, or resumable and finished byte-identically by a rerun; no
spill file is ever left. Also: the fingerprint (versions, path spellings), loud summaries and
option checks."""

from __future__ import annotations

import errno
import json
import os
import re

import numpy as np
import pytest

from packcheck import finished_shards, hash_tree, invoke, write_docs
from packtool.config import PackConfig
from packtool.errors import EngineError, OutputError, SchemaError
from packtool.formats.manifest import IN_PROGRESS_NAME, LOCK_NAME, TMP_DIR_NAME
from packtool.pipeline import run_pack

C = 16
OPTS = dict(capacity=C, rows_per_shard=4, workers=1, seed=3)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("rob") / "in"
    rng = np.random.default_rng(2)
    for f in range(2):
        write_docs(d / f"{f}.parquet", [rng.integers(0, 500, int(k)).tolist()
                                        for k in rng.integers(0, 30, 40)])
    return d


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("robref") / "out"
    run_pack(PackConfig(inputs=(str(src),), output=str(out), window_docs=15, **OPTS),
             progress=False)
    return out


def _cfg(src, out, **kw):
    return PackConfig(inputs=(str(src),), output=str(out), **{**OPTS, "window_docs": 15, **kw})


def _no_scratch(out):
    if out.exists():
        names = {p.name for p in out.iterdir()}
        assert TMP_DIR_NAME not in names and LOCK_NAME not in names, names


@pytest.mark.parametrize("existing", [False, True])
def test_late_bad_value_in_the_last_window_leaves_output_as_before(tmp_path, existing):
    """An empty (or missing) OUTPUT, windows of 5 documents and a negative id in the last
    window: the run fails with one line and OUTPUT is exactly as before."""
    docs = [[1, 2, 3]] * 23 + [[4, -5, 6]]
    write_docs(tmp_path / "in" / "a.parquet", docs)
    out = tmp_path / "out"
    if existing:
        out.mkdir()
    res = invoke(["pack", "-q", "--window-docs", "5", "-c", C, tmp_path / "in", out])
    assert res.exit_code == 1 and "row 23 (0-based): negative token id" in res.output
    assert res.output.count("\n") == 1
    if existing:
        assert list(out.iterdir()) == []
    else:
        assert not out.exists()


def test_bad_value_under_overwrite_keeps_the_previous_output(tmp_path, src):
    """--overwrite replaces the old output only once the new input has been read cleanly."""
    out = tmp_path / "out"
    run_pack(_cfg(src, out), progress=False)
    before = hash_tree(out)
    write_docs(tmp_path / "bad" / "a.parquet", [[1, 2]] * 9 + [[3, -1]])
    with pytest.raises(SchemaError, match="negative token id"):
        run_pack(_cfg(tmp_path / "bad", out, overwrite=True), progress=False)
    assert hash_tree(out) == before
    _no_scratch(out)


@pytest.mark.parametrize("point", ["shard-2", "memory"])
def test_a_write_failure_under_overwrite_keeps_the_previous_output(tmp_path, src, monkeypatch,
                                                                  point):
    """--overwrite with other options over a finished output, then a full disk while shard 2
    is written, or memory running short in it: the old output is as it was, byte for byte (the new run's pending shards and marker are removed), and the message
    says so; it was deleted when the first new shard was written. The same command then
    replaces it."""
    from packtool.errors import ResourceError
    from packtool.pipeline import write as write_mod

    out = tmp_path / "out"
    run_pack(_cfg(src, out), progress=False)
    before = hash_tree(out)
    def short():
        raise MemoryError

    monkeypatch.setattr(write_mod, "write_shard", _fail_on_call(
        write_mod.write_shard, 3, short if point == "memory" else _full_disk))
    with pytest.raises(ResourceError if point == "memory" else OutputError) as err:
        run_pack(_cfg(src, out, seed=4, overwrite=True), progress=False)
    assert "OUTPUT is as it was before the run" in str(err.value), err.value
    assert hash_tree(out) == before
    _no_scratch(out)
    monkeypatch.undo()
    run_pack(_cfg(src, out, seed=4, overwrite=True), progress=False)
    fresh = tmp_path / "fresh"
    run_pack(_cfg(src, fresh, seed=4), progress=False)
    assert hash_tree(out) == hash_tree(fresh)


def _full_disk(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _disk_fills(monkeypatch, free: int = 0):
    """A full disk as it is: ENOSPC raised, and from then on ``free`` bytes free (a disk
    that said full with as many bytes free as the pack needs is out of inodes)."""
    import shutil as sh

    usage = sh.disk_usage

    def fail(*_a, **_k):
        monkeypatch.setattr("packtool.output.shutil.disk_usage",
                            lambda p: usage(p)._replace(free=free))
        _full_disk()

    return fail


def _io_error(*_a, **_k):
    raise OSError(errno.EIO, "Input/output error")


def _fail_on_call(real, n, fail):
    calls = []

    def wrapper(*a, **k):
        calls.append(1)
        if len(calls) == n:
            fail()
        return real(*a, **k)

    return wrapper


@pytest.mark.parametrize("point", ["preflight", "spill", "row-spill", "shard-0", "shard-2",
                                   "manifest"])
def test_full_disk_at_any_write_point_is_one_line_and_leaves_no_spill(tmp_path, src, reference,
                                                                      monkeypatch, point):
    """ENOSPC injected while spilling, spilling a window's rows in row order, writing shard 0 or
    2, or the manifest (and a preflight with too little free space): one OutputError line naming the bytes needed; no
    scratch left; OUTPUT is as before or resumable, and a rerun ends byte-identical."""
    from packtool.pipeline import plan as plan_mod
    from packtool.pipeline import write as write_mod

    out = tmp_path / "out"
    if point == "preflight":
        import shutil as sh

        usage = sh.disk_usage
        monkeypatch.setattr("packtool.output.shutil.disk_usage",
                            lambda p: usage(p)._replace(free=10))
    elif point == "spill":  # a read part's spill: its tokens written, then no space
        from packtool.pipeline import read as read_mod

        monkeypatch.setattr(read_mod, "spill_writer",
                            _fail_on_call(read_mod.spill_writer, 2, _disk_fills(monkeypatch)))
    elif point == "row-spill":  # window 3's plan (2 files per window before it)
        monkeypatch.setattr(plan_mod, "spill_writer",
                            _fail_on_call(plan_mod.spill_writer, 7, _disk_fills(monkeypatch)))
    elif point.startswith("shard"):
        k = int(point.split("-")[1])
        monkeypatch.setattr(write_mod, "write_shard",
                            _fail_on_call(write_mod.write_shard, k + 1, _disk_fills(monkeypatch)))
    else:
        from packtool import output

        monkeypatch.setattr(output, "publish_manifest",
                            _fail_on_call(output.publish_manifest, 1, _disk_fills(monkeypatch)))
    with pytest.raises(OutputError) as err:
        run_pack(_cfg(src, out), progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "no space left on device" in msg, msg
    assert re.search(r"needs [\d,]+ bytes for its scratch and up to [\d,]+ more for its shards",
                     msg), msg
    monkeypatch.undo()
    _no_scratch(out)
    if point in ("preflight", "spill", "row-spill"):
        assert not out.exists() and "as it was before" in msg
    else:
        assert (out / IN_PROGRESS_NAME).is_file() and "rerun the same command" in msg
    n_ref = len(list(reference.glob("part-*.parquet")))
    done = {"shard-2": 2, "manifest": n_ref}.get(point, 0)
    assert len(finished_shards(out)) == done
    res = run_pack(_cfg(src, out), progress=False)
    assert res.shards_reused == done
    assert hash_tree(out) == hash_tree(reference)


@pytest.mark.parametrize("point", ["shard-0", "shard-2"])
def test_full_disk_while_writing_names_what_a_rerun_needs(tmp_path, src, reference, monkeypatch,
                                                          point):
    """The bytes a full-disk message asks for are enough for the rerun it suggests: with that
    much free, the rerun (which spills the windows again before the shards left) is not refused
    by its own free-space check, and it ends byte-identical."""
    import re
    import shutil as sh

    from packtool.pipeline import write as write_mod

    out = tmp_path / "out"
    k = int(point.split("-")[1])
    monkeypatch.setattr(write_mod, "write_shard",
                        _fail_on_call(write_mod.write_shard, k + 1, _disk_fills(monkeypatch)))
    with pytest.raises(OutputError) as err:
        run_pack(_cfg(src, out), progress=False)
    monkeypatch.undo()
    msg = str(err.value)
    scratch, shards = (int(x.replace(",", "")) for x in re.search(
        r"needs ([\d,]+) bytes for its scratch and up to ([\d,]+) more", msg).groups())
    asked = scratch + shards
    usage = sh.disk_usage
    monkeypatch.setattr("packtool.output.shutil.disk_usage",
                        lambda p: usage(p)._replace(free=asked))
    run_pack(_cfg(src, out), progress=False)
    assert hash_tree(out) == hash_tree(reference)


def test_io_error_while_writing_is_one_line_and_resumable(tmp_path, src, reference, monkeypatch):
    from packtool.pipeline import write as write_mod

    out = tmp_path / "out"
    monkeypatch.setattr(write_mod, "write_shard", _fail_on_call(write_mod.write_shard, 4,
                                                                _io_error))
    with pytest.raises(OutputError, match=r"cannot write \(Input/output error\); the finished "
                                          r"shards are kept"):
        run_pack(_cfg(src, out), progress=False)
    monkeypatch.undo()
    _no_scratch(out)
    assert run_pack(_cfg(src, out), progress=False).shards_reused == 3
    assert hash_tree(out) == hash_tree(reference)


def test_failed_engine_task_takes_the_same_cleanup_path(tmp_path, src, reference, monkeypatch):
    """A task failing for another reason than bad input (as a Ray task whose worker is lost):
    scratch removed, finished shards kept, rerun finishes."""
    from packtool.pipeline import write as write_mod

    def lost(*_a, **_k):
        raise EngineError("a Ray task of write_shard_task failed: worker died")

    out = tmp_path / "out"
    monkeypatch.setattr("packtool.pipeline.write_shard_task",
                        _fail_on_call(write_mod.write_shard_task, 2, lambda: lost()))
    with pytest.raises(EngineError, match="worker died"):
        run_pack(_cfg(src, out), progress=False)
    monkeypatch.undo()
    _no_scratch(out)
    assert (out / IN_PROGRESS_NAME).is_file()
    run_pack(_cfg(src, out), progress=False)
    assert hash_tree(out) == hash_tree(reference)


def _crash_after(monkeypatch, n):
    from packtool.pipeline import write as write_mod

    def stop():
        raise KeyboardInterrupt

    monkeypatch.setattr("packtool.pipeline.write_shard_task",
                        _fail_on_call(write_mod.write_shard_task, n + 1, stop))


def test_fingerprint_takes_the_resolved_input_path(tmp_path, src, monkeypatch):
    """`in` and `./in` are the same input: the rerun keeps the finished shards."""
    import shutil

    shutil.copytree(src, tmp_path / "in")
    monkeypatch.chdir(tmp_path)
    _crash_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        run_pack(_cfg("in", "out"), progress=False)
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert run_pack(_cfg("./in/", "out"), progress=False).shards_reused == 2


def test_fingerprint_covers_library_versions(tmp_path, src, reference, monkeypatch):
    """After an upgrade of a library that decides the bytes, finished shards are not reused,
    and a finished output is no longer 'already done'."""
    from packtool import output

    out = tmp_path / "out"
    _crash_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        run_pack(_cfg(src, out), progress=False)
    monkeypatch.undo()
    real = output._versions
    monkeypatch.setattr(output, "_versions", lambda: {**real(), "numpy": "99.0"})
    res = run_pack(_cfg(src, out), progress=False)
    assert res.shards_reused == 0 and res.windows_reused == 0  # Ctrl-C kept them: stale now
    assert run_pack(_cfg(src, out), progress=False).already_complete
    monkeypatch.setattr(output, "_versions", lambda: {**real(), "pyarrow": "99.0"})
    with pytest.raises(OutputError, match="--overwrite"):
        run_pack(_cfg(src, out), progress=False)


def test_fingerprint_sees_a_rewritten_input_with_the_same_size_and_mtime(tmp_path, src):
    import shutil

    from packtool.formats.reader import discover_inputs
    from packtool.output import fingerprint

    shutil.copytree(src, tmp_path / "in")
    f = tmp_path / "in" / "0.parquet"
    before = fingerprint({}, discover_inputs([tmp_path / "in"]))
    st = f.stat()
    data = bytearray(f.read_bytes())
    data[-20] ^= 1  # a byte inside the footer
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint({}, discover_inputs([tmp_path / "in"])) != before


@pytest.mark.parametrize("overflow,words", [("drop", "removed"), ("truncate", "removed")])
def test_overflow_removing_many_tokens_is_loud(tmp_path, overflow, words):
    """Most tokens in documents over C: the summary and --json say how many were removed."""
    write_docs(tmp_path / "in" / "a.parquet", [[1] * 50, [2] * 5, [3] * 60])
    res = invoke(["pack", "-c", C, "--overflow", overflow, tmp_path / "in", tmp_path / "o"])
    assert res.exit_code == 0, res.output
    assert "WARNING: --overflow " + overflow in res.output and "% of the tokens" in res.output
    assert res.output.count("WARNING: --overflow") == 1  # once, on stderr
    again = invoke(["pack", "-c", C, "--overflow", overflow, tmp_path / "in", tmp_path / "o"])
    assert again.exit_code == 0 and "nothing to do" in again.output
    assert "WARNING" not in again.output  # a no-op rerun wrote nothing to warn about
    res = invoke(["pack", "--json", "-c", C, "--overflow", overflow, tmp_path / "in",
                  tmp_path / "j"])
    body = res.output[res.output.index("{"):]
    assert any(words in w for w in json.loads(body)["warnings"])
    res = invoke(["pack", "--json", "-c", 64, "--overflow", overflow, tmp_path / "in",
                  tmp_path / "k"])
    assert json.loads(res.output)["warnings"] == []


def test_ray_address_without_ray_engine_is_a_usage_error(tmp_path, src):
    res = invoke(["pack", "--ray-address", "auto", src, tmp_path / "o"])
    assert res.exit_code == 2 and "--ray-address applies only with --engine ray" in res.output
    assert not (tmp_path / "o").exists()
    res = invoke(["pack", "-q", "-c", C, src, tmp_path / "o"], env={"RAY_ADDRESS": "auto"})
    assert res.exit_code == 0, res.output  # the environment variable alone is not an option


def test_read_only_install_puts_the_kernel_cache_in_a_user_directory(tmp_path):
    """When packtool/core is not writable, NUMBA_CACHE_DIR points to a user cache directory."""
    import subprocess
    import sys

    code = ("import os\nos.access = lambda p, m: False\nimport packtool\n"
            "print(os.environ.get('NUMBA_CACHE_DIR'))")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.stdout.strip() == str(tmp_path / "cache" / "packtool" / "numba"), res.stderr


def test_first_compile_note(tmp_path, monkeypatch):
    """Without a kernel cache the note is given; with one, not."""
    from packtool import startup

    monkeypatch.setattr(startup, "_KERNELS", tmp_path / "core" / "_kernels.py")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "nc"))
    monkeypatch.delenv("NUMBA_DISABLE_JIT", raising=False)
    assert "compiling the packing kernels" in startup.compile_note()
    (tmp_path / "nc" / "x").mkdir(parents=True)
    (tmp_path / "nc" / "x" / "_kernels._fill_rows-462.py311.nbi").write_bytes(b"")
    assert startup.compile_note() is None


def test_output_inside_a_packed_output_is_refused(tmp_path, src, reference):
    """Shards of another pack nested in a packed output would break it as a Parquet dataset."""
    import shutil
    outer = tmp_path / "outer"
    shutil.copytree(reference, outer)
    before = hash_tree(outer)
    res = invoke(["pack", "-q", "-c", C, src, outer / "sub"])
    assert res.exit_code == 1 and "inside the packed output" in res.output, res.output
    assert res.output.count("\n") == 1
    assert hash_tree(outer) == before and not (outer / "sub").exists()


@pytest.mark.parametrize("overwrite", [False, True])
def test_output_holding_foreign_files_is_refused_and_they_are_kept(tmp_path, src, overwrite):
    """Files packtool did not write are never deleted, and never left beside new shards."""
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    (out / "sub" / "y.txt").write_text("mine too")
    res = invoke(["pack", "-q", "-c", C, *(["--overwrite"] if overwrite else []), src, out])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    # with or without --overwrite, the one line names them (advising --overwrite would only
    # lead to this refusal)
    assert "did not write (notes.txt, sub)" in res.output
    assert "--overwrite replaces only what packtool wrote" in res.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "sub"]
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("names", [["part-0.parquet", "part-1.parquet"], ["part-00000.parquet"],
                                   ["part-00007.parquet"]])
def test_parquet_files_named_like_shards_are_not_taken_for_packtools(tmp_path, src, names):
    """A folder of the user's own Parquet files named part-*.parquet (pyarrow's write_dataset
    writes part-0.parquet) was emptied by --overwrite: a name is no proof. Only a shard the
    manifest lists or whose footer names it as packtool's is replaced; these are refused and
    kept, as any foreign file, also when OUTPUT is a link to the folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    for n in names:
        pq.write_table(pa.table({"input_ids": [[1, 2, 3], [4, 5]]}), data / n)
    link = tmp_path / "link"
    link.symlink_to(data)
    before = hash_tree(data)
    for out in (data, link):
        for flags in ([], ["--overwrite"]):
            res = invoke(["pack", "-q", "-c", C, *flags, src, out])
            assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
            assert f"holds {len(names)} entr" in res.output
            assert "packtool did not write" in res.output and names[0] in res.output
            assert hash_tree(data) == before
    # packtool's own shards stay replaceable without their manifest (removed by hand)
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 32, src, out]).exit_code == 0
    (out / ".packtool-manifest.parquet").unlink()
    res = invoke(["pack", "-q", "--overwrite", "-c", C, src, out])
    assert res.exit_code == 0, res.output


def test_overwrite_replaces_a_previous_pack(tmp_path, src, reference):
    """--overwrite still replaces packtool's own output (shards and manifest)."""
    out = tmp_path / "out"
    assert invoke(["pack", "-q", "-c", 32, src, out]).exit_code == 0
    opts = ["-c", C, "--rows-per-shard", 4, "--workers", 1, "--seed", 3, "--window-docs", 15]
    res = invoke(["pack", "-q", "--overwrite", *opts, src, out])
    assert res.exit_code == 0, res.output
    assert hash_tree(out) == hash_tree(reference)


def test_damaged_output_is_restored_by_the_rerun_the_messages_name(tmp_path, src, reference):
    """A shard cut short: stats refuses it and says to rerun the same pack, which restores the
    exact bytes; a shard edited in place (the same size) needs --overwrite, which does too. An
    intact output rerun with --overwrite is written anew, identically."""
    import shutil
    opts = ["-c", C, "--rows-per-shard", 4, "--workers", 1, "--seed", 3, "--window-docs", 15]
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    shard = sorted(out.glob("part-*.parquet"))[1]
    data = bytearray(shard.read_bytes())
    shard.write_bytes(bytes(data[:-7]))  # another size: a plain rerun redoes this very pack
    res = invoke(["stats", out])  # the plain rerun it names packs it again
    assert res.exit_code == 1 and "rerun the same packtool pack command, which packs it " \
        "again" in res.output, res.output
    res = invoke(["pack", "-q", *opts, src, out])
    assert res.exit_code == 0, res.output
    assert hash_tree(out) == hash_tree(reference)
    shard.unlink()  # deleted: the same
    res = invoke(["stats", out])
    assert res.exit_code == 1 and "missing; rerun the same packtool pack command, which packs " \
        "it again" in res.output, res.output
    assert invoke(["pack", "-q", *opts, src, out]).exit_code == 0
    assert hash_tree(out) == hash_tree(reference)
    data[len(data) // 2] ^= 0xFF  # same size, edited in place
    shard.write_bytes(bytes(data))
    assert hash_tree(out) != hash_tree(reference)
    res = invoke(["pack", "-q", "--overwrite", *opts, src, out])
    assert res.exit_code == 0, res.output
    assert hash_tree(out) == hash_tree(reference)


def test_interrupted_manifest_write_leaves_no_temporary(tmp_path, monkeypatch):
    """Ctrl-C while the manifest's temporary is written (before its rename): no temporary and
    no manifest."""
    from packtool import location
    from packtool.formats import manifest as mf
    from packtool.formats.schema import packed_schema

    def interrupt(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(location.os, "fsync", interrupt)
    m = mf.Manifest(format_version=3, packtool_version="0", fingerprint="f", capacity=8,
                    labels=mf.LabelsInfo(False, "unshifted"))
    with pytest.raises(KeyboardInterrupt):
        mf.publish_manifest(tmp_path, m, packed_schema(8, "none"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("factor", [1, 2])
def test_an_input_replaced_during_the_pack_is_refused(tmp_path, monkeypatch, factor):
    """A file swapped for one of as many rows or more while the pack read it: its first rows
    were packed under the old file's fingerprint, exit 0 (only fewer rows were caught). The
    file's size and modification time are checked after each piece is read."""
    import packtool.pipeline.read as R

    docs = [[(3 * i + k) % 50 + 1 for k in range(1 + i % 9)] for i in range(40)]
    src = write_docs(tmp_path / "in" / "a.parquet", docs)
    orig, swapped = R.iter_documents, []

    def swap(path, *args, **kwargs):
        if not swapped:  # another writer replaces the file, atomically, as the read starts
            swapped.append(path)
            new = write_docs(tmp_path / "new" / "a.parquet",
                             [list(reversed(d)) + [7] for d in docs] * factor)
            os.replace(new, src)
        return orig(path, *args, **kwargs)

    monkeypatch.setattr(R, "iter_documents", swap)
    out = tmp_path / "out"
    res = invoke(["pack", "-q", "-c", C, "--workers", 1, src.parent, out])
    assert swapped and res.exit_code == 1, res.output
    assert f"{src}: the file changed during the pack" in res.output, res.output
    assert not (out / ".packtool-manifest.parquet").exists()


@pytest.mark.parametrize("step", ["make_dirs", "lock"])
@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_as_output_is_created_or_locked_leaves_it_as_before(tmp_path, src, monkeypatch,
                                                                    step, existing):
    """SIGINT arriving just after OUTPUT (and its parents) is made, or just after its lock is
    taken: the run says nothing was kept, and that is true: a new OUTPUT is gone with the
    parents it made, an existing empty one holds nothing (no lock file)."""
    import signal

    from packtool import location, output

    def interrupt():
        os.kill(os.getpid(), signal.SIGINT)

    if step == "make_dirs":
        real = location.make_dirs

        def make(path):
            made = real(path)
            interrupt()
            return made

        monkeypatch.setattr(location, "make_dirs", make)
    else:
        class Lock(output.FileLock):
            def acquire(self, *a, **k):
                got = super().acquire(*a, **k)
                interrupt()
                return got

        monkeypatch.setattr(output, "FileLock", Lock)
    out = tmp_path / "new" / "out"
    if existing:
        out.mkdir(parents=True)
    with pytest.raises(KeyboardInterrupt, match="nothing was kept"):
        run_pack(_cfg(src, out), progress=False)
    if existing:
        assert list(out.iterdir()) == []
    else:
        assert not (tmp_path / "new").exists()


def test_full_disk_that_no_rerun_can_fit_says_so(tmp_path, src, reference, monkeypatch):
    """A full disk while writing shards, on a disk too small to hold the scratch a rerun
    writes again beside the finished shards kept: the line says to choose another OUTPUT, not
    to rerun (the rerun would be refused, or fill the disk again)."""
    import shutil as sh

    from packtool.pipeline import write as write_mod

    out = tmp_path / "out"
    monkeypatch.setattr(write_mod, "write_shard",
                        _fail_on_call(write_mod.write_shard, 3, _full_disk))
    usage = sh.disk_usage
    monkeypatch.setattr("packtool.output.shutil.disk_usage",
                        lambda p: usage(p)._replace(total=14_000, free=20_000))
    with pytest.raises(OutputError) as err:
        run_pack(_cfg(src, out), progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "no space left on device" in msg, msg
    assert re.search(r"this disk \([\d,]+ bytes\) cannot hold the scratch .* beside the [\d,]+ "
                     r"bytes of the 2 finished shards kept in OUTPUT: choose another OUTPUT",
                     msg), msg
    assert "rerun the same command" not in msg, msg


def _shard_bytes(out):
    """Bytes of the finished shards in ``out`` (kept pending beside no manifest)."""
    return sum(p.stat().st_size for p in out.iterdir() if ".part-" in p.name or
               p.name.startswith("part-"))


def test_full_disk_advice_follows_its_figures(tmp_path, monkeypatch):
    """A full disk while writing shards, with less free than the scratch a rerun writes again
    plus the shards left: the line asks for that much more before a rerun; on a disk that,
    beside the finished shards kept, can never hold it, the line says so and advises another
    OUTPUT, never a rerun (which would fill the disk again)."""
    from packtool.pipeline import write as write_mod

    rng = np.random.default_rng(0)
    src = write_docs(tmp_path / "in" / "a.parquet",
                     [rng.integers(0, 50, int(n)).tolist() for n in rng.integers(20, 200, 2000)])
    out = tmp_path / "out"
    monkeypatch.setattr(write_mod, "write_shard",
                        _fail_on_call(write_mod.write_shard, 3, _disk_fills(monkeypatch)))
    with pytest.raises(OutputError) as err:
        run_pack(_cfg(src, out, capacity=128, rows_per_shard=200), progress=False)
    msg = str(err.value)
    scratch, shards = (int(x.replace(",", "")) for x in re.search(
        r"needs ([\d,]+) bytes for its scratch and up to ([\d,]+) more", msg).groups())
    kept = _shard_bytes(out)
    found = re.search(r"a rerun writes about ([\d,]+) bytes", msg)
    assert found, msg
    asked = int(found.group(1).replace(",", ""))
    assert scratch < asked < scratch + shards  # the shards left at the kept shards' compression
    assert f"(counted uncompressed; 0 free); a rerun writes about {asked:,} bytes (the scratch " \
           "again and the shards left, at the compression of the shards kept): free " \
           f"{asked:,} more bytes before it, or choose another OUTPUT (the finished shards are " \
           "kept (2): rerun the same command to finish)" in msg, msg
    monkeypatch.undo()

    out2 = tmp_path / "out2"
    total = kept + asked - 1  # the scratch fits beside the kept shards, not the rest
    import shutil as sh

    usage = sh.disk_usage
    monkeypatch.setattr("packtool.output.shutil.disk_usage",
                        lambda p: usage(p)._replace(total=total))
    monkeypatch.setattr(write_mod, "write_shard",
                        _fail_on_call(write_mod.write_shard, 3, _disk_fills(monkeypatch)))
    with pytest.raises(OutputError) as err:
        run_pack(_cfg(src, out2, capacity=128, rows_per_shard=200), progress=False)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"this disk ({total:,} bytes) has room for at most {total - kept:,} beside the " \
           f"{kept:,} bytes of the 2 finished shards kept in OUTPUT, and a rerun writes about " \
           f"{asked:,} bytes (the scratch again and the shards left, at the compression of the " \
           "shards kept): choose another OUTPUT, on a larger disk" in msg, msg
    assert "rerun the same command" not in msg, msg


@pytest.mark.parametrize("how", ["no inode free", "bytes to spare"])
def test_full_disk_out_of_inodes_is_said_so(tmp_path, src, monkeypatch, how):
    """ENOSPC from a filesystem out of inodes (files) while bytes are free (tmpfs
    nr_inodes=, a disk of many small files): the line names inodes and df -i, not a byte
    shortage its own figures contradict; told by statvfs's f_favail of 0, or by as many bytes
    free as the pack needs. A quota (EDQUOT) is no inode shortage."""
    from packtool.pipeline import write as write_mod

    if how == "no inode free":
        real = os.statvfs

        def statvfs(path):
            st = real(path)
            return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, st.f_bfree,
                                      st.f_bavail, 1000, 0, 0, st.f_flag, st.f_namemax))

        monkeypatch.setattr(os, "statvfs", statvfs)
        fail = _disk_fills(monkeypatch)  # no byte free either: the inodes are what is said
    else:
        fail = _full_disk  # the real disk's free bytes: more than this small pack needs
    out = tmp_path / "out"
    monkeypatch.setattr(write_mod, "write_shard", _fail_on_call(write_mod.write_shard, 2, fail))
    with pytest.raises(OutputError) as err:
        run_pack(_cfg(src, out), progress=False)
    msg = str(err.value)
    assert "\n" not in msg
    assert re.search(r"out: no space left on device: the filesystem has run out of inodes "
                     r"\(files\), not bytes \([\d,]+ bytes free, no new file can be made; see "
                     r"df -i .*out\): remove files on it that are not needed, or choose another "
                     r"OUTPUT, on a filesystem with more inodes \(the finished shards are kept "
                     r"\(1\): rerun the same command to finish\)", msg), msg
    assert "bytes for its scratch" not in msg
    monkeypatch.undo()
    if how == "bytes to spare":  # a quota: its limit is not the disk's free bytes
        def quota(*_a, **_k):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")

        monkeypatch.setattr(write_mod, "write_shard",
                            _fail_on_call(write_mod.write_shard, 2, quota))
        with pytest.raises(OutputError) as err:
            run_pack(_cfg(src, tmp_path / "out2"), progress=False)
        assert "run out of inodes" not in str(err.value) and "bytes for its scratch" in str(err.value)


def test_a_scratch_file_that_cannot_be_read_back_is_told_as_a_read(tmp_path, src, monkeypatch):
    """A scratch spill removed (or truncated) under a running pack: the line says "cannot
    read", never "cannot write", naming the file."""
    from packtool.pipeline import write as write_mod

    out = tmp_path / "out"
    real = write_mod.write_shard

    def gone(*a, **k):
        for p in (out / TMP_DIR_NAME).rglob("*"):
            if p.is_file() and p.name.startswith("tokens"):  # the token spills
                p.unlink()
        return real(*a, **k)

    monkeypatch.setattr(write_mod, "write_shard", gone)
    with pytest.raises(OutputError) as err:
        run_pack(_cfg(src, out), progress=False)
    msg = str(err.value)
    assert "\n" not in msg
    assert re.search(r"tokens[^:]*: cannot read \(No such file or directory\)", msg), msg
    assert "cannot write" not in msg, msg


def test_a_read_only_output_is_refused_without_a_space_warning(tmp_path, src, monkeypatch,
                                                               caplog):
    """OUTPUT on a read-only mount (statvfs's ST_RDONLY; a mount that reports little free):
    the one "cannot write (Read-only file system)" line, with no free-space WARNING before it
    (the pack would not fill the disk: it cannot write at all)."""
    import logging
    import shutil as sh

    out = tmp_path / "out"
    real, usage = os.statvfs, sh.disk_usage

    def statvfs(path):
        st = real(path)
        if str(path).startswith(str(out)):
            return os.statvfs_result((*st[:8], st.f_flag | os.ST_RDONLY, st.f_namemax))
        return st

    monkeypatch.setattr(os, "statvfs", statvfs)
    monkeypatch.setattr("packtool.output.shutil.disk_usage",
                        lambda p: usage(p)._replace(free=10))
    caplog.set_level(logging.WARNING)
    with pytest.raises(OutputError) as err:
        run_pack(_cfg(src, out, overwrite=True), progress=False)
    assert "cannot write (Read-only file system)" in str(err.value), err.value
    assert "no space left" not in str(err.value)
    assert not [r for r in caplog.records if "bytes free" in r.getMessage()], caplog.text
