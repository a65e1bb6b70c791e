"""A machine that runs short is not bad data, and what a failed pack says it left is true.

Out of memory (``MemoryError``, pyarrow's ``ArrowMemoryError``, NumPy's ``_ArrayMemoryError``,
``ENOMEM``) and too many open files (``EMFILE``) are injected in every phase of a pack: each is
one ``ResourceError`` line naming the shortage and the phase's fixes, never "damaged" or
"regenerate", never a traceback or "internal error"; OUTPUT is as before or resumable exactly as
for any other failure. The state sentence matches what is on disk (no shard finished, some, all
but the manifest). A finished identical output is recognised on storage where nothing can be
written (the lock included)."""

from __future__ import annotations

import errno

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packcheck import hash_tree, invoke, write_docs
from packtool.config import PackConfig
from packtool.errors import (EXIT_DATA, OutOfMemoryError, OutputError, ResourceError, shortage,
                             shortage_error)
from packtool.formats.manifest import IN_PROGRESS_NAME, LOCK_NAME, TMP_DIR_NAME
from packtool.pipeline import run_pack

C = 16
OPTS = dict(capacity=C, rows_per_shard=4, workers=1, seed=3, window_docs=15)
BAD_DATA_WORDS = ("damaged", "regenerate", "truncated", "internal error")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("short") / "in"
    rng = np.random.default_rng(5)
    for f in range(2):
        write_docs(d / f"{f}.parquet", [rng.integers(0, 500, int(k)).tolist()
                                        for k in rng.integers(1, 30, 40)])
    return d


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("shortref") / "out"
    run_pack(PackConfig(inputs=(str(src),), output=str(out), **OPTS), progress=False)
    return out


def _cfg(src, out, **kw):
    return PackConfig(inputs=(str(src),), output=str(out), **{**OPTS, **kw})


def _array_memory_error() -> MemoryError:
    """NumPy's own out-of-memory exception (a MemoryError subclass), as numpy raises it."""
    try:
        np.empty(1 << 59, dtype=np.uint8)  # 512 PiB: more than any address space
    except MemoryError as exc:
        return exc
    raise AssertionError("numpy allocated 512 PiB")


MEMORY_FAILURES = {
    "arrow": lambda: pa.ArrowMemoryError("realloc of size 1048576 failed"),
    "numpy": _array_memory_error,
    "bare": MemoryError,
    "enomem": lambda: OSError(errno.ENOMEM, "Cannot allocate memory"),
}


def _fail_on_call(real, n, exc_factory):
    calls = []

    def wrapper(*a, **k):
        calls.append(1)
        if len(calls) == n:
            raise exc_factory()
        return real(*a, **k)

    return wrapper


def _one_line_shortage(msg: str, what: str) -> None:
    assert "\n" not in msg and what in msg, msg
    assert not any(w in msg for w in BAD_DATA_WORDS), msg


def test_shortage_kinds():
    """What counts as running short: every MemoryError, ENOMEM, EMFILE/ENFILE (also as the
    ``[errno N]`` pyarrow writes into its messages); nothing else."""
    for make in MEMORY_FAILURES.values():
        assert shortage(make()) == "memory"
    assert shortage(OSError(errno.EMFILE, "Too many open files")) == "files"
    assert shortage(OSError("Failed to open local file. Detail: [errno 24] Too many open "
                            "files")) == "files"
    assert shortage(pa.ArrowInvalid("Detail: [errno 12] Cannot allocate memory")) == "memory"
    # under ulimit -v: a thread that cannot start, a shared library that cannot be mapped
    assert shortage(RuntimeError("can't start new thread")) == "memory"
    assert shortage(OSError("Could not find/load shared object file 'libllvmlite.so'.\n Error "
                            "was: libllvmlite.so: failed to map segment from shared "
                            "object")) == "memory"
    for other in (OSError(errno.EIO, "Input/output error"), pa.ArrowInvalid("bad page"),
                  ValueError("x"), KeyboardInterrupt(), RuntimeError("dictionary changed"),
                  OSError("Could not find/load shared object file 'libllvmlite.so'")):
        assert shortage(other) is None and shortage_error(other) is None


@pytest.mark.parametrize("kind", sorted(MEMORY_FAILURES))
def test_out_of_memory_reading_input_is_not_a_damaged_file(tmp_path, src, monkeypatch, kind):
    """The reported fault: a row group whose decoding runs out of memory was called damaged,
    "regenerate it". Now: out of memory, the file named, the read phase's fixes, OUTPUT as
    before (a new OUTPUT is not left behind)."""
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        _fail_on_call(pq.ParquetFile.iter_batches, 1, MEMORY_FAILURES[kind]))
    out = tmp_path / "out"
    with pytest.raises(OutOfMemoryError) as err:
        run_pack(_cfg(src, out), progress=False)
    msg = str(err.value)
    _one_line_shortage(msg, "out of memory")
    assert "row group 0" in msg and "fewer --workers" in msg and "as it was before" in msg, msg
    assert not out.exists()


def test_out_of_memory_planning_names_window_docs(tmp_path, src, monkeypatch):
    from packtool.pipeline import plan as plan_mod

    monkeypatch.setattr("packtool.pipeline.plan_window",
                        _fail_on_call(plan_mod.plan_window, 2, MemoryError))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(OutOfMemoryError, match=r"--window-docs N .*as it was before the run"):
        run_pack(_cfg(src, out), progress=False)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("kind", ["arrow", "bare"])
def test_out_of_memory_writing_keeps_the_finished_shards(tmp_path, src, reference, monkeypatch,
                                                         kind):
    """While shards are written: the write phase's fixes, the two finished shards kept, and the
    rerun finishes byte-identically."""
    from packtool.pipeline import write as write_mod

    monkeypatch.setattr(write_mod, "write_shard",
                        _fail_on_call(write_mod.write_shard, 3, MEMORY_FAILURES[kind]))
    out = tmp_path / "out"
    with pytest.raises(OutOfMemoryError) as err:
        run_pack(_cfg(src, out), progress=False)
    msg = str(err.value)
    _one_line_shortage(msg, "out of memory")
    assert "--row-group-mb" in msg and "finished shards are kept (2)" in msg, msg
    monkeypatch.undo()
    assert TMP_DIR_NAME not in {p.name for p in out.iterdir()}
    assert run_pack(_cfg(src, out), progress=False).shards_reused == 2
    assert hash_tree(out) == hash_tree(reference)


def test_cli_bare_memory_error_is_one_line_not_internal_error(tmp_path, src, monkeypatch):
    """A MemoryError escaping any command is one line, exit 1, never a traceback or "internal
    error ... report it"."""
    monkeypatch.setattr("packtool.pipeline._prepare", _fail_on_call(lambda c: None, 1,
                                                                     MemoryError))
    res = invoke(["pack", "-q", "-c", C, src, tmp_path / "out"])
    assert res.exit_code == EXIT_DATA and res.output.startswith("Error: "), res.output
    _one_line_shortage(res.output.strip(), "out of memory")
    monkeypatch.undo()
    run_pack(_cfg(src, tmp_path / "ok"), progress=False)
    monkeypatch.setattr("packtool.formats.manifest.Manifest.from_dict",
                        _fail_on_call(lambda *a: None, 1, MemoryError))
    res = invoke(["stats", tmp_path / "ok"])
    assert res.exit_code == EXIT_DATA, res.output
    _one_line_shortage(res.output.strip(), "out of memory")


def test_too_many_open_files_opening_input_is_not_a_bad_file(tmp_path, src, monkeypatch):
    """EMFILE opening an input was "not a readable Parquet file ... regenerate it"."""
    real = pq.ParquetFile.__init__
    monkeypatch.setattr(pq.ParquetFile, "__init__", _fail_on_call(
        real, 1, lambda: OSError(errno.EMFILE, "Too many open files")))
    with pytest.raises(ResourceError) as err:
        run_pack(_cfg(src, tmp_path / "out"), progress=False)
    msg = str(err.value)
    _one_line_shortage(msg, "too many open files")
    assert "ulimit -n" in msg and "as it was before" in msg, msg


def test_too_many_open_files_while_finding_the_inputs_is_not_a_bad_path(tmp_path, src,
                                                                        monkeypatch):
    """EMFILE while discovery looks at INPUT was "cannot be read ... check the INPUT path"."""
    import packtool.formats.reader as reader

    real = reader.filesystem_of

    class Full:
        def __init__(self, fs):
            self.fs = fs

        def get_file_info(self, path):
            raise OSError(errno.EMFILE, "Too many open files")

        def __getattr__(self, name):
            return getattr(self.fs, name)

    monkeypatch.setattr(reader, "filesystem_of",
                        lambda given: (Full(real(given)[0]), *real(given)[1:]))
    res = invoke(["pack", "-q", "-c", C, src, tmp_path / "out"])
    assert res.exit_code == EXIT_DATA, res.output
    _one_line_shortage(res.output.strip(), "too many open files")
    assert "INPUT path" not in res.output, res.output


def test_failure_before_any_shard_does_not_claim_finished_shards(tmp_path, src, reference,
                                                                 monkeypatch):
    """The reported fault: EMFILE on a spill while writing the first shard said "the finished
    shards are kept" though none was; the marker alone is left and the message says so."""
    from packtool.pipeline import write as write_mod

    monkeypatch.setattr(write_mod, "write_shard", _fail_on_call(
        write_mod.write_shard, 1, lambda: OSError(errno.EMFILE, "Too many open files",
                                                  "out/.packtool-tmp/read-00000/tokens.int32")))
    out = tmp_path / "out"
    with pytest.raises(ResourceError) as err:
        run_pack(_cfg(src, out), progress=False)
    msg = str(err.value)
    _one_line_shortage(msg, "too many open files")
    assert "no shard was finished" in msg and "finished shards are kept" not in msg, msg
    assert sorted(p.name for p in out.iterdir()) == [IN_PROGRESS_NAME]
    monkeypatch.undo()
    run_pack(_cfg(src, out), progress=False)
    assert hash_tree(out) == hash_tree(reference)


def test_failure_writing_the_manifest_says_only_the_manifest_is_missing(tmp_path, src,
                                                                       reference, monkeypatch):
    from packtool import output

    monkeypatch.setattr(output, "publish_manifest", _fail_on_call(
        output.publish_manifest, 1, lambda: OSError(errno.EIO, "Input/output error")))
    out = tmp_path / "out"
    with pytest.raises(OutputError, match="only the manifest is missing: rerun"):
        run_pack(_cfg(src, out), progress=False)
    n = len(list(reference.glob("part-*.parquet")))
    assert len(list(out.glob("part-*.parquet"))) == n


def _read_only(monkeypatch):
    """Every write packtool could make to a local OUTPUT fails as on a read-only mount (the
    tests run as root, for whom chmod does not bar writing)."""
    from packtool.location import LocalPath

    def erofs(*_a, **_k):
        raise OSError(errno.EROFS, "Read-only file system")

    for name in ("makedirs", "publish_bytes", "publish_file", "delete", "delete_tree"):
        monkeypatch.setattr(LocalPath, name, erofs)
    monkeypatch.setattr("packtool.output.FileLock.acquire", erofs)


def test_complete_output_on_read_only_storage_is_nothing_to_do(tmp_path, src, reference,
                                                               monkeypatch):
    """The reported fault: the rerun of a finished pack on a read-only filesystem failed taking
    the lock ("cannot write (Read-only file system)"). It is recognised without writing."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(reference, out)
    before = hash_tree(out)
    _read_only(monkeypatch)
    res = run_pack(_cfg(src, out), progress=False)
    assert res.already_complete and res.shards_reused == len(res.manifest.shards)
    cli = invoke(["pack", "-q", "-c", C, "--rows-per-shard", 4, "--workers", 1, "--seed", 3,
                  "--window-docs", 15, src, out])
    assert cli.exit_code == 0, cli.output
    monkeypatch.undo()
    assert hash_tree(out) == before
    # what needs writing still says so: another pack of the same OUTPUT
    _read_only(monkeypatch)
    with pytest.raises(OutputError, match="Read-only file system"):
        run_pack(_cfg(src, out, seed=4), progress=False)


def test_complete_output_while_another_pack_holds_the_lock_is_refused(tmp_path, src, reference):
    """Deciding before the lock never answers "nothing to do" while another pack writes."""
    import shutil

    from filelock import FileLock

    out = tmp_path / "out"
    shutil.copytree(reference, out)
    with FileLock(out / LOCK_NAME):
        with pytest.raises(OutputError, match="another packtool run"):
            run_pack(_cfg(src, out), progress=False)
    assert run_pack(_cfg(src, out), progress=False).already_complete


def _measured_peak(cfg, monkeypatch):
    """Run ``cfg`` and return the bytes OUTPUT held at its peak: every file under it when the
    manifest is about to be written (every shard and the whole scratch), plus the manifest."""
    from pathlib import Path

    from packtool import output

    seen, real = [], output.Output.commit

    def commit(self, manifest, schema):
        seen.append(sum(p.stat().st_size for p in Path(cfg.output).rglob("*") if p.is_file()))
        real(self, manifest, schema)
        seen[-1] += (Path(cfg.output) / ".packtool-manifest.parquet").stat().st_size

    monkeypatch.setattr(output.Output, "commit", commit)
    run_pack(cfg, progress=False)
    monkeypatch.undo()
    return seen[0]


@pytest.mark.parametrize("case", ["ids", "tiny-docs", "labels"])
def test_free_space_check_refuses_what_cannot_fit_and_warns_what_may_not(tmp_path, monkeypatch,
                                                                         case):
    """The reported fault: the check before reading asked for 15.8 MB and the pack then needed
    27.9 MB (it counted the spills and plans, not the shards), with no word of it. Shards are
    compressed, so their size is known only once written: the check refuses only a pack whose
    scratch (spilled uncompressed: exact) cannot fit, and warns, naming the bound, when the
    scratch and the shards counted uncompressed may not. Incompressible ids (the worst case
    for size), documents of 1-2 tokens (per-document costs), stored labels with padded
    segments: the bound covers the measured peak; less free than the scratch is refused before
    anything is written; one byte under the measured peak warns; 4x the peak runs silently."""
    import shutil

    from packtool.pipeline import disk_peak

    rng = np.random.default_rng(11)
    lens = (1, 3) if case == "tiny-docs" else (1, 200)
    write_docs(tmp_path / "in" / "a.parquet",
               [rng.integers(0, 2**31 - 1, int(k)).tolist() for k in rng.integers(*lens, 800)])
    kw = dict(labels="shifted", segment_multiple=8, append_eos=1) if case == "labels" else {}
    cfg = PackConfig(inputs=(str(tmp_path / "in"),), output=str(tmp_path / "ref"), capacity=128,
                     workers=1, rows_per_shard=32, **kw)
    peak = _measured_peak(cfg, monkeypatch)
    pq_md = pq.read_metadata(tmp_path / "in" / "a.parquet")
    tokens = pq_md.row_group(0).column(0).num_values
    scratch, shards = disk_peak(cfg, tokens, pq_md.num_rows, 1, flags=False)  # no labels read
    assert scratch + shards >= peak  # the bound covers the measured peak
    assert scratch < peak
    usage = shutil.disk_usage
    for free, expect in ((scratch - 1, "refused"), (peak - 1, "warned"), (4 * peak, "quiet")):
        monkeypatch.setattr("packtool.output.shutil.disk_usage",
                            lambda p, free=free: usage(p)._replace(free=free))
        out = tmp_path / f"out-{free}"
        run = PackConfig(inputs=cfg.inputs, output=str(out), capacity=128, workers=1,
                         rows_per_shard=32, **kw)
        if expect == "refused":
            with pytest.raises(OutputError, match="no space left on device.*as it was before"):
                run_pack(run, progress=False)
            assert not out.exists()
        else:
            res = run_pack(run, progress=False)
            assert not res.already_complete
            warned = [w for w in res.warnings if "bytes free, and this pack may need" in w]
            assert bool(warned) == (expect == "warned"), res.warnings
        monkeypatch.undo()


@pytest.mark.parametrize("labels_column", [False, True])
def test_the_scratch_asked_for_is_what_the_pack_spills(tmp_path, monkeypatch, labels_column):
    """The free-space check refuses a pack whose scratch cannot fit, so the scratch it asks for
    must be what the pack spills, not more: a rerun after a full disk (its finished shards
    taking room) was refused though it fitted, when a byte of target flags was asked for per
    token with no labels column read. Asked: at least the scratch measured at its peak, within
    a tenth of it; with a labels column read, its flags counted too."""
    import pyarrow as pa
    from pathlib import Path

    from packtool import output
    from packtool.formats.reader import reads_labels
    from packtool.pipeline import _prepare, disk_peak

    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 50_000, int(k)).tolist() for k in rng.integers(50, 400, 600)]
    table = {"input_ids": pa.array(docs, pa.list_(pa.int64()))}
    if labels_column:
        table["labels"] = pa.array(docs, pa.list_(pa.int64()))
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table(table), tmp_path / "in" / "a.parquet")
    cfg = PackConfig(inputs=(str(tmp_path / "in"),), output=str(tmp_path / "out"), capacity=512,
                     workers=1, rows_per_shard=32,
                     labels_column="labels" if labels_column else None)
    seen, real = [], output.Output.commit

    def commit(self, manifest, schema):
        seen.append(sum(p.stat().st_size for p in Path(self.tmp.path).rglob("*")
                        if p.is_file()))
        real(self, manifest, schema)

    monkeypatch.setattr(output.Output, "commit", commit)
    run_pack(cfg, progress=False)
    run = _prepare(cfg)
    flags = reads_labels(run.files, run.cfg.column, run.cfg.labels_column)
    assert flags == labels_column
    scratch, _ = disk_peak(run.cfg, sum(p.tokens for p in run.parts),
                           sum(p.docs for p in run.parts), run.windows.count, flags=flags)
    assert seen[0] <= scratch <= 1.1 * seen[0], (scratch, seen[0])


@pytest.mark.parametrize("quiet", [[], ["-q"]])
def test_the_low_space_warning_is_printed_once(tmp_path, quiet):
    """Less free than the scratch and the shards' bound: the WARNING line is printed on stderr
    once, as soon as it is known (it was printed again with the summary's warnings), with or
    without -q; ``--json`` lists it in its warnings."""
    import json
    import subprocess
    import sys

    rng = np.random.default_rng(3)
    write_docs(tmp_path / "in" / "a.parquet",
               [rng.integers(0, 50_000, int(k)).tolist() for k in rng.integers(50, 400, 300)])
    # free: a little over the scratch, far under the shards counted uncompressed
    script = ("import shutil, sys\n"
              "usage = shutil.disk_usage\n"
              "shutil.disk_usage = lambda p: usage(p)._replace(free=500_000)\n"
              "from packtool.cli import cli\n"
              "cli(sys.argv[1:])\n")
    for args in (quiet, ["--json"]):
        out = tmp_path / f"out{len(args)}{args[:1]}"
        proc = subprocess.run([sys.executable, "-c", script, "pack", *args, "-c", "512",
                               str(tmp_path / "in"), str(out)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.count("bytes free, and this pack may need") == 1, proc.stderr
        if args == ["--json"]:
            said = json.loads(proc.stdout)["warnings"]
            assert any("bytes free, and this pack may need" in w for w in said), said
