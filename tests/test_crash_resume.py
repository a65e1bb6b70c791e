"""A ``pack`` killed with SIGKILL at any phase leaves no manifest (nothing a reader accepts);
rerunning the same command finishes the job with the bytes of an uninterrupted run, reusing
the shards already finished; a rerun with other options reuses nothing.

The kill points come from the pipeline's test hook ``PACKTOOL_TEST_PAUSE_AT=<phase>[:<shard>]``:
the process announces the phase on stderr and sleeps there until the test kills it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from packcheck import (finished_shards, hash_pack, hash_tree, invoke, paused_pack, pending,
                       stopped_at, write_docs)
from packtool.errors import ManifestError
from packtool.formats.manifest import (IN_PROGRESS_NAME, LOCK_NAME, MANIFEST_NAME, TMP_DIR_NAME,
                                       load_manifest, read_manifest)
from packtool.output import (PARTIAL_PROGRESS, READ_DIR_PREFIX, SCRATCH_FINGERPRINT,
                             WINDOW_DIR_PREFIX, WINDOW_DONE)

OPTIONS = ["--capacity", "16", "--rows-per-shard", "4", "--workers", "1", "--seed", "3"]


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("crash") / "in"
    for f in range(2):
        write_docs(d / f"{f}.parquet",
                   [[f * 1000 + i * 10 + k for k in range(i % 11)] for i in range(40)])
    return d


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "out"
    res = invoke(["pack", "-q", *OPTIONS, src, out])
    assert res.exit_code == 0, res.output
    assert len(load_manifest(out, check_hashes=True).shards) >= 4
    return out


def kill_at(phase: str, src: Path, out: Path, options=OPTIONS) -> None:
    """Start ``packtool pack`` as a process, wait until it pauses at ``phase``, SIGKILL it."""
    with paused_pack(src, out, phase, options):
        pass


def rerun(src: Path, out: Path, options=OPTIONS, warnings: list | None = None) -> dict:
    res = invoke(["pack", "--json", *options, src, out])
    assert res.exit_code == 0, res.output
    if warnings is not None:
        warnings.extend(line for line in res.stderr.splitlines() if line.startswith("WARNING"))
    return json.loads(res.stdout)  # the summary; warnings go to stderr


@pytest.mark.parametrize("phase,reused", [
    ("read", 0), ("plan", 0), ("write-shard:0", 0), ("write-shard:2", 2), ("manifest", "all"),
])
def test_killed_pack_is_incomplete_and_rerun_finishes_identically(tmp_path, src, reference,
                                                                    phase, reused):
    out = tmp_path / "out"
    kill_at(phase, src, out)
    assert out.is_dir()
    assert not (out / MANIFEST_NAME).exists()
    with pytest.raises(ManifestError, match=f"no {MANIFEST_NAME}"):
        load_manifest(out)
    if phase.startswith("write-shard"):  # the shard being written is only a temporary file
        shard = int(phase.split(":")[1])
        assert not (out / f"part-{shard:05d}.parquet").exists()
        assert not pending(out, f"part-{shard:05d}.parquet").exists()
        assert list((out / TMP_DIR_NAME).glob(f"*part-{shard:05d}.parquet*"))
    result = rerun(src, out)
    n_shards = len(read_manifest(reference).shards)
    assert result["shards_reused"] == (n_shards if reused == "all" else reused)
    assert hash_tree(out) == hash_tree(reference)
    load_manifest(out, check_hashes=True)


def test_rerun_with_other_options_does_not_reuse_stale_shards(tmp_path, src):
    out = tmp_path / "out"
    kill_at("write-shard:2", src, out)
    assert pending(out, "part-00001.parquet").exists()
    other = [o if o != "3" else "4" for o in OPTIONS]  # another --seed: other shard contents
    said = []
    result = rerun(src, out, other, said)
    assert result["shards_reused"] == 0
    # the run says what it replaced
    assert any("OUTPUT held an interrupted pack of other options (--seed 3 -> 4) (" in w
               and "finished shards): replaced by this pack" in w for w in said), said
    fresh = tmp_path / "fresh"
    rerun(src, fresh, other)
    assert hash_tree(out) == hash_tree(fresh)


def test_rerun_after_input_changed_does_not_reuse(tmp_path, src):
    """The fingerprint covers the inputs: an edited input shard invalidates finished shards."""
    import shutil

    mine = tmp_path / "in"
    shutil.copytree(src, mine)
    out = tmp_path / "out"
    kill_at("write-shard:2", mine, out)
    write_docs(mine / "0.parquet", [[5, 6, 7]] * 40)
    result = rerun(mine, out)
    assert result["shards_reused"] == 0
    fresh = tmp_path / "fresh"
    rerun(mine, fresh)
    assert {k: v for k, v in hash_tree(out).items() if k != MANIFEST_NAME} == {
        k: v for k, v in hash_tree(fresh).items() if k != MANIFEST_NAME}
    load_manifest(out, check_hashes=True)


def test_finished_output_is_kept_and_an_identical_rerun_does_nothing(tmp_path, src):
    """A finished OUTPUT: the same command is a no-op (exit 0); other options need
    --overwrite."""
    out = tmp_path / "out"
    rerun(src, out)
    before = hash_tree(out)
    res = invoke(["pack", *OPTIONS, src, out])
    assert res.exit_code == 0 and "nothing to do" in res.output, res.output
    assert hash_tree(out) == before
    other = [o if o != "3" else "4" for o in OPTIONS]
    res = invoke(["pack", "-q", *other, src, out])
    assert res.exit_code == 1 and "--overwrite" in res.output
    assert hash_tree(out) == before


def _start(src: Path, out: Path, pause: str | None = None, options=OPTIONS, hold_sigint=False):
    """``packtool pack`` as a process. ``hold_sigint``: SIGINT and SIGTERM start blocked, so one
    sent while
    the interpreter itself starts (site, path hooks: before any packtool code exists, over
    100 ms on a loaded machine) stays pending until packtool's handler unblocks it."""
    env = dict(os.environ)
    env.pop("PACKTOOL_TEST_PAUSE_AT", None)
    if pause:
        env["PACKTOOL_TEST_PAUSE_AT"] = pause

    def block():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})

    return subprocess.Popen([sys.executable, "-m", "packtool", "pack", "-q", *options,
                             str(src), str(out)], stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=block if hold_sigint else None)


def _clean_or_resumable(out: Path) -> int:
    """No manifest, no lock file, no temporary name: either nothing at all, or the scratch with
    only its fingerprint, finished windows and read parts, and the work directories of read
    parts begun with their progress records; marker and shards. Returns the finished windows
    kept."""
    if not out.exists():
        return 0
    names = {p.name for p in out.iterdir()}
    assert MANIFEST_NAME not in names and LOCK_NAME not in names
    assert names <= {IN_PROGRESS_NAME, TMP_DIR_NAME} | {
        pending(out, n).name for n in finished_shards(out)}
    if TMP_DIR_NAME not in names:
        return 0
    kept = {p.name for p in (out / TMP_DIR_NAME).iterdir()} - {SCRATCH_FINGERPRINT}
    finished = {n for n in kept if n.startswith((WINDOW_DIR_PREFIX, READ_DIR_PREFIX))}
    begun = kept - finished
    assert kept, kept
    assert all((out / TMP_DIR_NAME / n / WINDOW_DONE).is_file() for n in finished), kept
    assert all(n.startswith(".") and f"-{READ_DIR_PREFIX}" in n
               and (out / TMP_DIR_NAME / n / PARTIAL_PROGRESS).is_file() for n in begun), kept
    assert (out / TMP_DIR_NAME / SCRATCH_FINGERPRINT).is_file()
    return sum(n.startswith(WINDOW_DIR_PREFIX) for n in finished)


@pytest.mark.parametrize("delay", [0.1, 0.5, 1.0, 3.0, "write"])
def test_sigint_at_any_moment_exits_130_clean_or_resumable(tmp_path, src, reference, delay):
    """Ctrl-C at 0.1 s, 0.5 s, 1 s, 3 s after start and while writing a shard: exit 130 with one
    line and no traceback; OUTPUT is clean or resumable and the rerun gives the reference."""
    out = tmp_path / "out"
    # the run waits at the pause; SIGINT is sent after ``delay`` s, or once it waits there
    err = _ctrl_c_at("write-shard:1", src, out, OPTIONS, hold_sigint=True,
                     delay=None if delay == "write" else delay)
    assert "interrupted" in err, err
    kept = _clean_or_resumable(out)
    if delay == "write":
        assert pending(out, "part-00000.parquet").is_file()
        assert kept == 1  # the one window was planned before writing began
    assert rerun(src, out)["windows_reused"] == kept
    assert hash_tree(out) == hash_tree(reference)


def test_second_identical_pack_is_refused_at_once_while_the_first_runs(tmp_path, src, reference):
    """Two identical packs into one OUTPUT: the second is refused with one line (lock held) and
    touches nothing; the first, killed, is then finished by a rerun."""
    import time

    out = tmp_path / "out"
    first = _start(src, out, pause="write-shard:1")
    try:
        assert "test pause at write-shard:1" in first.stderr.readline()
        before = sorted(p.name for p in out.iterdir())
        t = time.perf_counter()
        res = invoke(["pack", "-q", *OPTIONS, src, out])
        assert time.perf_counter() - t < 10
        assert res.exit_code == 1
        assert res.output.count("\n") == 1 and "another packtool pack is writing" in res.output
        assert sorted(p.name for p in out.iterdir()) == before
        assert list((out / TMP_DIR_NAME).iterdir())  # the first run's scratch is untouched
    finally:
        first.kill()
        first.wait()
        first.stderr.close()
    rerun(src, out)
    assert hash_tree(out) == hash_tree(reference)


def test_killed_during_the_windows_rerun_reuses_the_finished_windows(tmp_path, src):
    """SIGKILL while window 1 is planned (window 0 finished): the rerun reads only the windows
    not finished, and ends with the bytes of an uninterrupted windowed run; a rerun with other
    options reuses no window."""
    options = [*OPTIONS, "--window-docs", "25"]
    ref = tmp_path / "ref"
    assert rerun(src, ref, options)["windows_reused"] == 0
    out = tmp_path / "out"
    kill_at("plan:1", src, out, options)
    assert (out / TMP_DIR_NAME / "window-00000" / "done.json").is_file()
    assert not (out / TMP_DIR_NAME / "window-00001").exists()
    report = rerun(src, out, options)
    assert report["windows_reused"] == 1
    assert hash_tree(out) == hash_tree(ref)
    assert not (out / TMP_DIR_NAME).exists()

    other = tmp_path / "other"
    kill_at("plan:1", src, other, options)
    seeded = [o if o != "3" else "4" for o in options]  # --seed: a different fingerprint
    warned: list = []
    assert rerun(src, other, seeded, warned)["windows_reused"] == 0
    # and says so: the scratch alone held that work (stopped before a shard, so no marker), and
    # it went without a word while the same run stopped later was warned of
    assert [w for w in warned if "OUTPUT held the kept work of an interrupted pack of other "
            "options or inputs (1 read part (80 documents" in w
            and w.endswith("planned window): replaced by this pack")] == [warned[0]], warned


def test_ctrl_c_once_the_pack_has_ended_leaves_exit_0_and_no_interrupted_line(tmp_path, src,
                                                                           reference):
    """Ctrl-C after the manifest is written, while the process tears down (the interpreter's
    exit takes a fraction of a second): the pack is finished, so the exit status stays 0 and no
    "interrupted ... nothing was written" line is printed."""
    out = tmp_path / "out"
    code = ("import atexit, os, signal, sys, time\n"
            "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(1)))\n"
            f"sys.argv = ['packtool', 'pack', '-q', *{[str(o) for o in OPTIONS]!r}, "
            f"{str(src)!r}, {str(out)!r}]\n"
            "from packtool.__main__ import main\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "interrupted" not in proc.stderr, proc.stderr
    assert hash_tree(out) == hash_tree(reference)


def test_ctrl_c_just_after_the_manifest_is_written_finishes_the_pack(tmp_path, src, reference,
                                                                     monkeypatch):
    """Ctrl-C once the manifest is on disk: the pack is complete, so the run tidies OUTPUT
    (marker, scratch, lock removed) and exits 0; it never reports "no manifest" beside one."""
    import packtool.output as output

    original = output.publish_manifest

    def then_ctrl_c(*args, **kwargs):
        original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        import time
        time.sleep(0.2)  # the handler runs here, in the main thread

    monkeypatch.setattr(output, "publish_manifest", then_ctrl_c)
    out = tmp_path / "out"
    res = invoke(["pack", "-q", *OPTIONS, src, out])
    assert res.exit_code == 0, res.output
    assert hash_tree(out) == hash_tree(reference)
    assert {p.name for p in out.iterdir() if p.name.startswith(".")} == {MANIFEST_NAME}


_KILLED_AFTER_MANIFEST = """
import os, signal, sys
import packtool.output as output
original = output.publish_manifest

def then_kill(*args, **kwargs):
    original(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)

output.publish_manifest = then_kill
sys.argv = ["packtool", *sys.argv[1:]]
from packtool.__main__ import main
main()
"""


def test_a_rerun_tidies_what_a_pack_killed_after_its_manifest_left(tmp_path, src, reference):
    """SIGKILL just after the manifest is written: the marker, the scratch and the lock file
    stay beside a complete output. The same command finds it complete ("nothing to do") and
    removes them (they stayed for ever), so OUTPUT ends as an undisturbed run leaves it."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", _KILLED_AFTER_MANIFEST, "pack", "-q",
                           *OPTIONS, str(src), str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = {p.name for p in out.iterdir()}
    assert {MANIFEST_NAME, IN_PROGRESS_NAME, TMP_DIR_NAME, LOCK_NAME} <= left, left
    res = invoke(["pack", *OPTIONS, src, out])
    assert res.exit_code == 0 and "nothing to do" in res.output, res.output
    assert hash_tree(out) == hash_tree(reference)
    assert {p.name for p in out.iterdir()} == {p.name for p in reference.iterdir()}


def rows_readers_see(out: Path) -> dict:
    """What each third-party Parquet reader of the folder ``out`` reads from it: rows, or the
    error it raised (polars and duckdb raise when their ``*.parquet`` glob matches no file, and
    datasets when the folder holds no data file)."""
    import pyarrow.dataset as pads

    def attempt(read):
        try:
            return read()
        except Exception as exc:  # each reader's own "no files" error
            return type(exc).__name__

    seen = {"pyarrow": attempt(lambda: pads.dataset(out).count_rows())}
    polars = pytest.importorskip("polars")
    seen["polars"] = attempt(lambda: polars.scan_parquet(f"{out}/*.parquet")
                             .select(polars.len()).collect().item())
    seen["polars-dir"] = attempt(lambda: polars.scan_parquet(out).select(polars.len())
                                 .collect().item())
    duckdb = pytest.importorskip("duckdb")
    for name, what in (("duckdb", f"{out}/*.parquet"), ("duckdb-dir", f"{out}/**/*.parquet")):
        seen[name] = attempt(lambda: duckdb.connect().execute(
            f"select count(*) from read_parquet('{what}')").fetchall()[0][0])
    datasets = pytest.importorskip("datasets")
    seen["datasets"] = attempt(lambda: datasets.load_dataset(
        "parquet", data_dir=str(out), split="train",
        cache_dir=str(out.parent / f"hf-{os.urandom(4).hex()}")).num_rows)
    return seen


def no_rows(seen: dict) -> bool:
    """Every reader read 0 rows or refused the folder."""
    return all(v == 0 or isinstance(v, str) for v in seen.values())


@pytest.mark.parametrize("phase,stop", [("write-shard:2", signal.SIGKILL),
                                        ("write-shard:2", signal.SIGINT),
                                        ("manifest", signal.SIGKILL),
                                        ("manifest", signal.SIGTERM)])
def test_an_unfinished_pack_shows_no_row_to_third_party_readers(tmp_path, src, reference,
                                                               phase, stop, monkeypatch):
    """pyarrow.dataset, polars, duckdb and datasets know no manifest: while a pack writes and
    once it was killed or stopped, its finished shards wait under names none of them reads
    (never a partial training set); the rerun keeps them and ends byte-identical."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "out"
    with paused_pack(src, out, phase, OPTIONS, stop=stop):
        assert finished_shards(out), "finished shards are kept for the rerun"
        live = rows_readers_see(out)
        assert no_rows(live), live
    assert finished_shards(out)
    stopped = rows_readers_see(out)
    assert no_rows(stopped), stopped
    n_shards = len(read_manifest(reference).shards)
    result = rerun(src, out)
    assert result["shards_reused"] == (n_shards if phase == "manifest" else 2)
    assert hash_tree(out) == hash_tree(reference)
    assert rows_readers_see(out)["pyarrow"] == read_manifest(reference).totals.rows


_KILLED_IN_THE_COMMIT = """
import os, signal, sys
from packtool import location
original = location.LocalPath.move_to
moved = []

def then_kill(self, dest):
    original(self, dest)
    moved.append(dest)
    if len(moved) == int(os.environ["KILL_AFTER_MOVES"]):
        os.kill(os.getpid(), signal.SIGKILL)

location.LocalPath.move_to = then_kill
sys.argv = ["packtool", *sys.argv[1:]]
from packtool.__main__ import main
main()
"""


@pytest.mark.parametrize("moves", [1, "all"])
def test_a_pack_killed_while_its_shards_take_their_final_names_is_finished_by_a_rerun(
        tmp_path, src, reference, moves):
    """The one moment a reader sees shards of an unfinished pack: between the first shard
    taking its final name and the manifest (the moves alone, the manifest's bytes made before
    them). SIGKILL there leaves the marker; the same command keeps every shard, under either
    name, moves the rest and writes the manifest."""
    n_shards = len(read_manifest(reference).shards)
    out = tmp_path / "out"
    env = dict(os.environ, KILL_AFTER_MOVES=str(n_shards if moves == "all" else moves))
    proc = subprocess.run([sys.executable, "-c", _KILLED_IN_THE_COMMIT, "pack", "-q",
                           *OPTIONS, str(src), str(out)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (out / MANIFEST_NAME).exists() and (out / IN_PROGRESS_NAME).is_file()
    assert len(list(out.glob("part-*.parquet"))) == (n_shards if moves == "all" else 1)
    assert len(finished_shards(out)) == n_shards
    with pytest.raises(ManifestError, match=f"no {MANIFEST_NAME}"):
        load_manifest(out)
    result = rerun(src, out)
    assert result["shards_reused"] == n_shards
    assert hash_tree(out) == hash_tree(reference)


def _ctrl_c_at(pause: str, src: Path, out: Path, options, *, delay: float | None = None,
               hold_sigint: bool = False, sig: int = signal.SIGINT) -> str:
    """Start ``packtool pack`` with a test pause at ``pause``; send ``sig`` (SIGINT) once it
    pauses there (``delay`` None) or ``delay`` seconds after the start. Asserts exit 128 + sig
    (130) without a traceback; returns stderr."""
    import time

    proc = _start(src, out, pause=pause, options=options, hold_sigint=hold_sigint)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        if delay is None:
            assert f"test pause at {pause}" in proc.stderr.readline()
        else:
            time.sleep(delay)
        os.kill(proc.pid, sig)
        code = proc.wait()
        err = proc.stderr.read()
    finally:
        watchdog.cancel()
        proc.kill()
        proc.stderr.close()
    assert code == 128 + sig, err
    assert "Traceback" not in err, err
    return err


def test_ctrl_c_after_a_window_finished_keeps_it_for_the_rerun(tmp_path, src):
    """Ctrl-C while window 1 is planned (window 0 finished): exit 130, a line saying a rerun
    resumes; the scratch keeps window 0 (and nothing under a temporary name), the lock is
    released; the rerun reuses window 0 and ends with the bytes of an undisturbed run. A Ctrl-C
    before any window finished keeps the read parts; before anything was read, a new OUTPUT is
    left absent, as before the run."""
    options = [*OPTIONS, "--window-docs", "25"]
    ref = tmp_path / "ref"
    assert rerun(src, ref, options)["windows_reused"] == 0
    out = tmp_path / "out"
    err = _ctrl_c_at("plan:1", src, out, options)
    assert "rerun the same command to resume" in err, err
    assert _clean_or_resumable(out) == 1
    assert (out / TMP_DIR_NAME / "window-00000" / WINDOW_DONE).is_file()
    assert not (out / IN_PROGRESS_NAME).exists()  # writing had not begun
    report = rerun(src, out, options)
    assert report["windows_reused"] == 1
    assert hash_tree(out) == hash_tree(ref)
    assert not (out / TMP_DIR_NAME).exists()

    # Ctrl-C while the only read part is read (its one piece not finished): nothing is kept
    early = tmp_path / "early"
    err = _ctrl_c_at("read", src, early, options)
    assert not early.exists() and "nothing was kept" in err, err
    # and it does not advise resuming what is not there (it said "rerun the same command to
    # resume and finish it")
    assert err.rstrip().endswith("nothing was kept; a rerun starts from the beginning") or \
        err.rstrip().endswith("is as before the run); a rerun starts from the beginning"), err
    assert "resume" not in err, err
    # before any window finished, the read parts are kept, and the message says so
    planning = tmp_path / "planning"
    err = _ctrl_c_at("plan:0", src, planning, options)
    assert "kept for the rerun: 1 read part (80 documents" in err, err
    assert _clean_or_resumable(planning) == 0
    assert rerun(src, planning, options)["parts_reused"] == 1
    assert hash_tree(planning) == hash_tree(ref)
    # what the kept scratch implies for another command into that OUTPUT: as after SIGKILL,
    # a scratch of other options is no pack to protect; it is replaced, nothing is reused
    other = tmp_path / "other"
    _ctrl_c_at("plan:1", src, other, options)
    seeded = [o if o != "3" else "4" for o in options]  # --seed: a different fingerprint
    warned: list = []
    assert rerun(src, other, seeded, warned)["windows_reused"] == 0
    assert any("OUTPUT held the kept work of an interrupted pack of other options or inputs"
               in w for w in warned), warned  # it was replaced without a word
    assert not (other / TMP_DIR_NAME).exists()


@pytest.mark.parametrize("pause", ["read", "plan:0", "write-shard:2", "manifest"])
def test_an_overwrite_stopped_before_it_commits_says_the_finished_output_is_untouched(
        tmp_path, src, reference, pause):
    """``pack --overwrite`` of other options over a finished output, Ctrl-C while it reads,
    plans, writes its shards or is about to commit: the old output is still complete, untouched
    and readable (the new run's shards wait beside it under pending names), and the line says
    so (it said OUTPUT "has no manifest"), with what the rerun keeps; the same command then
    replaces it, ending with the bytes of an undisturbed run. The old output used to be
    deleted when the first shard was written."""
    out = tmp_path / "out"
    rerun(src, out)
    before = hash_tree(out)
    other = [o if o != "3" else "4" for o in OPTIONS] + ["--overwrite"]
    err = _ctrl_c_at(pause, src, out, other)
    assert f"interrupted: {out} still holds its earlier finished pack, untouched" in err, err
    assert "has no manifest" not in err, err
    if pause == "plan:0":
        assert "untouched; kept for the rerun: 1 read part (80 documents" in err, err
    if pause.startswith(("write", "manifest")):
        assert "finished shard" in err.split("untouched; kept for the rerun: ")[1], err
    assert {k: v for k, v in hash_tree(out).items() if k in before} == before
    assert not [k for k in hash_tree(out) if k not in before and not k.startswith(
        (TMP_DIR_NAME, IN_PROGRESS_NAME)) and not k.endswith(".pending")]
    assert LOCK_NAME not in {p.name for p in out.iterdir()}
    assert invoke(["stats", out]).exit_code == 0 and invoke(["verify", out]).exit_code == 0
    assert rerun(src, out, other)["parts_reused"] == (pause != "read")
    fresh = tmp_path / "fresh"
    rerun(src, fresh, other)
    assert hash_tree(out) == hash_tree(fresh)


def _held(err: str) -> str:
    """What an interrupted pack's line says OUTPUT holds (between the stop word and the
    rerun's advice)."""
    [line] = err.strip().splitlines()
    assert line.startswith("Error: interrupted: "), line
    assert line.endswith("; rerun the same command to resume and finish it"), line
    return line[len("Error: interrupted: "):-len("; rerun the same command to resume and finish it")]


@pytest.mark.parametrize("first", ["plan:1", "write-shard:2", "overwrite"])
def test_a_rerun_stopped_before_it_enters_output_says_what_output_keeps(tmp_path, src, reference,
                                                                       first):
    """A pack stopped while it plans window 1 or writes shard 2 (or an --overwrite of a finished
    output stopped while it plans) keeps its work for the rerun. That rerun, stopped by SIGTERM
    before it touched OUTPUT (the test pause ``start``: reading the input's footers), said
    "nothing was written" while OUTPUT held that work, which the next rerun then reused. It
    now says what OUTPUT holds, in the words of the first stop, and the work is still reused."""
    options = [*OPTIONS, "--window-docs", "25"]
    out = tmp_path / "out"
    if first == "overwrite":
        rerun(src, out)
        options = [o if o != "3" else "4" for o in options] + ["--overwrite"]
    held = _held(_ctrl_c_at("plan:1" if first == "overwrite" else first, src, out, options))
    assert "kept for the rerun: " in held, held
    before = hash_tree(out)
    code, err = stopped_at(["pack", "-q", *options, src, out], "start", signal.SIGTERM)
    assert code == 143, err
    assert err == (f"packtool: terminated (SIGTERM): {held}; rerun the same command to resume "
                   "and finish it\n"), err
    assert hash_tree(out) == before
    report = rerun(src, out, options)
    assert report["parts_reused"] == 1 and report["windows_reused"] >= 1, report
    fresh = tmp_path / "fresh"
    rerun(src, fresh, options)
    assert hash_tree(out) == hash_tree(fresh)


def test_a_pack_stopped_before_it_enters_a_new_or_finished_output_says_nothing_was_written(
        tmp_path, src, reference):
    """Stopped before it touched OUTPUT (the test pause ``start``), a pack into a new OUTPUT or
    a finished one, which hold nothing of a stopped run, says the one start-up line."""
    new = tmp_path / "new"
    code, err = stopped_at(["pack", "-q", *OPTIONS, src, new], "start")
    assert (code, err) == (130, "packtool: interrupted; nothing was written\n"), err
    assert not new.exists()
    code, err = stopped_at(["pack", "-q", "--overwrite", *OPTIONS, src, reference], "start",
                           signal.SIGTERM)
    assert (code, err) == (143, "packtool: terminated (SIGTERM); nothing was written\n"), err


def test_a_pack_stopped_before_it_enters_a_store_output_does_not_say_it_kept_nothing(
        tmp_path, src, s3):
    """A store OUTPUT is not listed for the interrupted line, so a pack stopped before it
    touched one said "nothing was written" whether or not it held a stopped run's finished
    shards for the rerun: the line now says the store output is as it was and that the rerun
    resumes what a stopped run kept there."""
    fs, bucket = s3
    out = f"s3://{bucket}/packed"
    code, err = stopped_at(["pack", "-q", *OPTIONS, src, out], "start")
    assert code == 130, err
    assert err == (f"packtool: interrupted: nothing was written: {out} is as it was before "
                   "the run (a store output, not listed here: a rerun of the same command "
                   "resumes what a stopped run kept there)\n"), err
    assert fs.get_file_info(f"{bucket}/packed").type.name == "NotFound"


def test_a_pack_stopped_while_it_takes_output_says_what_output_keeps(tmp_path, src,
                                                                    monkeypatch):
    """Ctrl-C while the rerun of a stopped pack creates and locks OUTPUT (the run is stopping,
    OUTPUT not yet entered): the line said "nothing was kept (OUTPUT is as before the run)";
    it says what OUTPUT keeps for the rerun, which is still reused."""
    import packtool.output as output

    options = [*OPTIONS, "--window-docs", "25"]
    out = tmp_path / "out"
    held = _held(_ctrl_c_at("plan:1", src, out, options))

    def ctrl_c(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(output.LocalOutput, "_lock", ctrl_c)
    res = invoke(["pack", "-q", *options, src, out])
    assert res.exit_code == 130, res.output
    assert res.output.strip() == (f"Error: interrupted: {held}; rerun the same command to "
                                  "resume and finish it"), res.output
    monkeypatch.undo()
    assert rerun(src, out, options)["windows_reused"] == 1


@pytest.fixture(scope="module")
def four_files(tmp_path_factory) -> Path:
    """Four small files: one read part of four pieces (one per file)."""
    d = tmp_path_factory.mktemp("pieces") / "in"
    for f in range(4):
        write_docs(d / f"{f}.parquet",
                   [[f * 1000 + i * 10 + k for k in range(1 + i % 13)] for i in range(30)])
    return d


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_a_read_part_killed_between_pieces_resumes_from_its_last_piece(tmp_path, four_files,
                                                                       sig):
    """Killed (or Ctrl-C) while the third file of a read part is about to be read: the work
    directory keeps the two files read, with their progress record; the rerun reads only the
    other two (``docs_reused``), says so, and ends with the bytes of an undisturbed run. A
    Ctrl-C says what was kept."""
    from packtool.pipeline.read import plan_reads
    from packtool.formats.reader import discover_inputs

    parts = plan_reads(discover_inputs([four_files]), "input_ids")
    assert len(parts) == 1 and len(parts[0].pieces) == 4
    ref = tmp_path / "ref"
    rerun(four_files, ref)
    out = tmp_path / "out"
    if sig == "SIGKILL":
        kill_at("read-piece:2", four_files, out)
    else:
        err = _ctrl_c_at("read-piece:2", four_files, out, OPTIONS)
        assert "kept for the rerun: 0 read parts and 1 begun (60 documents" in err, err
        assert _clean_or_resumable(out) == 0
    begun = [p for p in (out / TMP_DIR_NAME).iterdir() if p.name.endswith("-read-00000")]
    assert len(begun) == 1 and (begun[0] / "progress.json").is_file()
    assert json.loads((begun[0] / "progress.json").read_text())["docs"] == 60
    report = rerun(four_files, out)
    assert report["docs_reused"] == 60 and report["parts_reused"] == 0
    assert hash_tree(out) == hash_tree(ref)
    assert not (out / TMP_DIR_NAME).exists()


def test_a_progress_record_longer_than_its_files_is_not_trusted(tmp_path, four_files):
    """A work directory whose files are shorter than its progress record says (a machine that
    lost its page cache) is read again from the start, never extended with zeros."""
    ref = tmp_path / "ref"
    rerun(four_files, ref)
    out = tmp_path / "out"
    kill_at("read-piece:2", four_files, out)
    begun = next(p for p in (out / TMP_DIR_NAME).iterdir() if p.name.endswith("-read-00000"))
    tokens = begun / "tokens.int32"
    os.truncate(tokens, tokens.stat().st_size - 8)
    report = rerun(four_files, out)
    assert report["docs_reused"] == 0
    assert hash_tree(out) == hash_tree(ref)


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_a_read_part_resumed_between_pieces_keeps_sources_and_the_holdout(tmp_path, sig):
    """--source-column and --holdout through a read part stopped after two of its four files:
    the part's source table (in order of first appearance, kept in the progress record) and
    the held-out documents of the files read continue where they stopped; both outputs end
    with the bytes of an undisturbed run and the same sorted source table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.formats.manifest import read_manifest

    src = tmp_path / "in"
    src.mkdir()
    names = ["zeta", "alpha", "mu", "beta"]
    for f in range(4):
        docs = [[f * 1000 + i * 10 + k for k in range(1 + i % 13)] for i in range(30)]
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int64())),
                                 "src": pa.array([names[i % min(f + 2, 4)] for i in range(30)])}),
                       src / f"{f}.parquet")
    options = OPTIONS + ["--source-column", "src", "--holdout", "0.2"]
    ref = tmp_path / "ref"
    rerun(src, ref, options)
    out = tmp_path / "out"
    if sig == "SIGKILL":
        kill_at("read-piece:2", src, out, options)
    else:
        err = _ctrl_c_at("read-piece:2", src, out, options)
        assert "kept for the rerun: 0 read parts and 1 begun (60 documents" in err, err
    begun = next(p for p in (out / TMP_DIR_NAME).iterdir() if p.name.endswith("-read-00000"))
    record = json.loads((begun / "progress.json").read_text())
    assert record["sources"] == ["zeta", "alpha", "mu"]  # files 0 and 1, first seen first
    report = rerun(src, out, options)
    assert report["docs_reused"] == 60 and report["stats"]["docs_other_split"] > 0
    for o, r in ((out, ref), (Path(f"{out}-holdout"), Path(f"{ref}-holdout"))):
        assert hash_pack(o) == hash_pack(r)
        assert read_manifest(o).source_values == ("alpha", "beta", "mu", "zeta")


def test_ctrl_c_during_the_writes_counts_every_shard_already_published(tmp_path, src):
    """Two writing threads, Ctrl-C while shard 1 waits and the other thread has published shard
    2, whose result the main thread (taking results in order) had not taken: the interrupted
    line counts the shards on disk, the ones the rerun keeps (it said fewer)."""
    import re
    import time

    out = tmp_path / "out"
    options = [*OPTIONS[:-4], "--workers", "2", "--seed", "3"]
    proc = _start(src, out, pause="write-shard:1", options=options)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        assert "test pause at write-shard:1" in proc.stderr.readline()
        deadline = time.monotonic() + 60
        while not pending(out, "part-00002.parquet").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait() == 130
        err = proc.stderr.read()
    finally:
        watchdog.cancel()
        proc.kill()
        proc.stderr.close()
    on_disk = len(finished_shards(out))
    assert pending(out, "part-00002.parquet").exists() and on_disk >= 2
    said = re.search(r"(\d+) finished shards?", err)
    assert said and int(said.group(1)) == on_disk, (err, on_disk)
    assert rerun(src, out, options)["shards_reused"] == on_disk


@pytest.mark.parametrize("when", [0.1, "read", "plan:0", "write-shard:1"])
def test_sigterm_stops_like_ctrl_c_and_exits_143(tmp_path, src, reference, when):
    """SIGTERM (what batch schedulers send before they kill a job), during start-up or while
    the pack reads, plans or writes: the clean stop of Ctrl-C, one line saying so and how to
    resume, exit 143 (128 + 15), no lock left; the rerun gives the bytes of an undisturbed run
    (it used to exit -15 with no message and a stale lock)."""
    out = tmp_path / "out"
    timed = isinstance(when, float)
    err = _ctrl_c_at("write-shard:1" if timed else when, src, out, OPTIONS, hold_sigint=timed,
                     delay=when if timed else None, sig=signal.SIGTERM)
    assert "terminated (SIGTERM)" in err, err
    if when == "read":  # nothing was kept yet: nothing to resume
        assert err.rstrip().endswith("nothing was kept (OUTPUT is as before the run); a rerun "
                                     "starts from the beginning"), err
    elif not timed:
        assert "rerun the same command to resume" in err, err
    _clean_or_resumable(out)  # no lock, no manifest, nothing under a temporary name
    rerun(src, out)
    assert hash_tree(out) == hash_tree(reference)


def test_sigterm_to_a_library_caller_cleans_output_then_ends_the_process(tmp_path, src,
                                                                         reference):
    """``packtool.pack`` in a program that keeps Python's default SIGTERM: the run stops
    cleanly (lock released, OUTPUT resumable) and the process then ends by SIGTERM, as it would
    have without packtool; the rerun finishes byte-identically."""
    out = tmp_path / "out"
    code = ("import packtool\n"
            f"packtool.pack({str(src)!r}, {str(out)!r}, capacity=16, rows_per_shard=4, "
            "workers=1, seed=3)\n"
            "print('returned')\n")
    env = dict(os.environ, PACKTOOL_TEST_PAUSE_AT="plan:0")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert "test pause at plan:0" in proc.stderr.readline()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == -signal.SIGTERM
        assert "returned" not in proc.stdout.read()
    finally:
        proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert _clean_or_resumable(out) == 0  # the read part is kept, no window yet
    rerun(src, out)
    assert hash_tree(out) == hash_tree(reference)


def test_the_ray_driver_keeps_packtools_sigterm_handler(monkeypatch):
    """``ray.init`` replaces the driver's SIGTERM handler with one that exits at once (status
    15, OUTPUT left locked); the Ray engine puts packtool's back, so SIGTERM stops a Ray pack
    as Ctrl-C does."""
    from packtool.engines import ray_engine

    class FakeRay:
        def is_initialized(self):
            return False

        def init(self, **kw):
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))

        def shutdown(self):
            pass

    monkeypatch.setattr(ray_engine, "import_ray", FakeRay)
    from packtool.signals import interruptible

    with interruptible():
        ours = signal.getsignal(signal.SIGTERM)
        with ray_engine.RayEngine(workers=1):
            assert signal.getsignal(signal.SIGTERM) is ours
    assert signal.getsignal(signal.SIGTERM) is not ours


def test_a_window_finished_before_tokens_dropped_counted_truncation_resumes_in_its_meaning(
        tmp_path, src):
    """A finished window whose saved counts have no ``counts_revision`` (a killed run of a
    packtool whose ``tokens_dropped`` left out the tails ``--overflow truncate`` cut): the rerun
    reuses it with its counts converted, and the manifest totals equal an undisturbed run's
    (tokens_dropped = every token not written, public case B11)."""
    from packtool.formats.manifest import read_manifest

    options = ["--capacity", "8", "--overflow", "truncate", "--rows-per-shard", "4",
               "--workers", "1", "--seed", "3", "--window-docs", "25"]
    ref = tmp_path / "ref"
    rerun(src, ref, options)
    want = read_manifest(ref).totals
    assert want.tokens_truncated > 0 and want.tokens_dropped == want.tokens_truncated
    assert want.tokens_in == want.real_tokens + want.tokens_dropped
    out = tmp_path / "out"
    _ctrl_c_at("plan:1", src, out, options)
    done = out / TMP_DIR_NAME / "window-00000" / WINDOW_DONE
    d = json.loads(done.read_text())
    assert d.pop("counts_revision") == 2 and d["stats"]["tokens_truncated"] > 0
    d["stats"]["tokens_dropped"] -= d["stats"]["tokens_truncated"]  # the older meaning
    done.write_text(json.dumps(d))
    assert rerun(src, out, options)["windows_reused"] == 1
    assert read_manifest(out).totals == want
    assert hash_tree(out) == hash_tree(ref)


@pytest.mark.parametrize("kept", [MANIFEST_NAME, IN_PROGRESS_NAME])
def test_the_temporary_of_a_manifest_or_marker_killed_before_its_rename_is_packtool_s(
        tmp_path, kept):
    """A kill between writing the manifest or the marker under its temporary name and the
    rename left ``.<name>.<hex>.tmp`` in OUTPUT, which every later run refused as an entry
    packtool did not write, rerun and --overwrite alike (a first marker's: the output could
    never be made). It is packtool's own: the next run that writes removes it and goes on; a
    rerun that finds the output complete writes nothing and is not refused."""
    src = write_docs(tmp_path / "in" / "a.parquet", [[i + 1] * (i % 7 + 1) for i in range(60)])
    args = ["pack", "-q", "-c", 8, "--rows-per-shard", 5, src]
    temp = f".{kept}.{'ab' * 16}.tmp"
    fresh = tmp_path / "fresh"  # killed at the first marker write: only the temporary
    fresh.mkdir()
    (fresh / temp).write_bytes(b"{\"fingerprint\": ")
    res = invoke([*args, fresh])
    assert res.exit_code == 0, res.output
    assert not (fresh / temp).exists()
    done = tmp_path / "done"  # killed later: the rerun and an --overwrite go on
    assert invoke([*args, done]).exit_code == 0
    (done / temp).write_bytes(b"PAR1")
    res = invoke([a for a in args if a != "-q"] + [done])  # reads only: left to a writing run
    assert res.exit_code == 0 and "nothing to do" in res.output, res.output
    res = invoke(["pack", "-q", "-c", 8, "--rows-per-shard", 9, "--overwrite", src, done])
    assert res.exit_code == 0, res.output
    assert not (done / temp).exists()
    other = f".notes.txt.{'ab' * 16}.tmp"  # a name of packtool's pattern for another file
    (done / other).write_text("mine")
    res = invoke(["pack", "-q", "-c", 8, "--overwrite", src, done])
    assert res.exit_code == 1 and other in res.output, res.output


@pytest.mark.parametrize("lost", ["deleted", "truncated"])
@pytest.mark.parametrize("over", [False, True])
def test_a_shard_not_where_its_task_wrote_it_fails_the_commit_and_leaves_output_as_before(
        tmp_path, src, monkeypatch, lost, over):
    """A shard missing from OUTPUT at the commit (deleted during the run; written by Ray tasks
    on a node's own disk) was skipped by the moves: the run exited 0 with a manifest listing a
    shard that is not there, and with --overwrite deleted the old pack's shards first. Now the
    commit checks every shard (name and size) before touching anything: one line naming the
    shard and the fix, exit 1, OUTPUT as before the run (the old pack untouched)."""
    import packtool.pipeline.write as write

    original = write.publish_shard

    def then_lose(written, output, name):
        original(written, output, name)
        if name == "part-00002.parquet":
            where = pending(Path(output), name)
            if lost == "deleted":
                where.unlink()
            else:
                where.write_bytes(where.read_bytes()[:-10])

    out = tmp_path / "out"
    other = [o if o != "3" else "4" for o in OPTIONS]
    if over:
        rerun(src, out, other)
    before = hash_tree(out) if over else None
    monkeypatch.setattr(write, "publish_shard", then_lose)
    res = invoke(["pack", "-q", *OPTIONS, *(["--overwrite"] if over else []), src, out])
    assert res.exit_code == 1, res.output
    msg = res.output.strip()
    assert len(msg.splitlines()) == 1 and "Traceback" not in msg, msg
    assert msg.startswith(f"Error: {out}: shard part-00002.parquet was not found where its task "
                          "wrote it"), msg
    assert "storage every node sees at the same path (or a store URI)" in msg, msg
    assert msg.endswith("OUTPUT is as it was before the run"), msg
    if over:
        assert hash_tree(out) == before
        assert invoke(["verify", out]).exit_code == 0
    else:
        assert not out.exists(), sorted(p.name for p in out.iterdir())
    monkeypatch.setattr(write, "publish_shard", original)
    rerun(src, out, [*OPTIONS, "--overwrite"] if over else OPTIONS)
    assert invoke(["verify", out]).exit_code == 0


@pytest.mark.parametrize("phase", ["read", "plan"])
def test_a_rerun_with_other_options_stopped_before_it_replaced_anything_says_whose_shards_stay(
        tmp_path, src, phase):
    """A pack killed after 2 shards, rerun with --seed 4 and stopped (Ctrl-C) before its first
    shard: the 2 shards of the first run are still there, and the same command would replace
    them, not resume them. The line says whose they are and what each command does with
    them (it said "nothing was kept ... rerun the same command to resume and finish it", or
    only what this run's scratch keeps), and the first command still resumes them."""
    out = tmp_path / "out"
    kill_at("write-shard:2", src, out)
    other = [o if o != "3" else "4" for o in OPTIONS]
    code, err = stopped_at(["pack", "-q", *other, src, out], phase)
    assert code == 130, err
    own = "; kept for a rerun of this command: 1 read part (80 documents, 372 tokens read)"
    assert err.strip().splitlines()[-1] == (
        f"Error: interrupted: {out} still holds an interrupted pack of other options (--seed 3 "
        f"-> 4) (2 finished shards), untouched{own if phase == 'plan' else ''}; rerun the "
        "command of those options to resume it, or this one to replace it"), err
    assert rerun(src, out)["shards_reused"] == 2
