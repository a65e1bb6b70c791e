"""Reading an OUTPUT while a ``pack`` writes it: whatever the instant, ``stats`` and the loader
say a pack is writing it (wait), or read a complete output; never "an interrupted pack" while
the pack lives. A finished pack writes its manifest before releasing its lock, and a starting
one takes its lock before it writes its marker, so a reader that looks at what the directory
holds first, then at the lock and the manifest again, is never fooled.

The tests pause a real ``pack --overwrite`` at each phase (``PACKTOOL_TEST_PAUSE_AT``), and
replay the two racy instants deterministically: the pack ends, or begins, between two looks.
"""

from __future__ import annotations

import shutil
import signal
import threading
from pathlib import Path

import pytest
from packcheck import invoke, paused_pack, write_docs

from packtool.errors import ManifestError
from packtool.formats import manifest as manifest_mod
from packtool.formats.manifest import IN_PROGRESS_NAME, MANIFEST_NAME, read_manifest
from packtool.formats.packed import PackedOutput

OPTIONS = ["--capacity", "16", "--rows-per-shard", "4", "--workers", "1"]


@pytest.fixture(scope="module")
def complete(tmp_path_factory) -> tuple[Path, Path]:
    """(INPUT, a complete OUTPUT of it)."""
    src = write_docs(tmp_path_factory.mktemp("live") / "in" / "a.parquet",
                     [[i * 10 + k for k in range(1 + i % 9)] for i in range(40)])
    out = src.parent.parent / "o_c"
    res = invoke(["pack", "-q", *OPTIONS, src, out])
    assert res.exit_code == 0, res.output
    return src, out


def _copy(out: Path, to: Path) -> Path:
    shutil.copytree(out, to)
    return to


@pytest.mark.parametrize("phase", ["read:0", "plan:0", "write-shard:1", "manifest"])
def test_a_pack_paused_at_any_phase_is_said_to_be_writing_not_interrupted(complete, tmp_path,
                                                                           phase):
    src, done = complete
    out = _copy(done, tmp_path / "o_c")
    with paused_pack(src, out, phase, ["--overwrite", *OPTIONS]):
        res = invoke(["stats", out])
        assert "interrupted" not in res.output, res.output
        assert res.exit_code == 0 or "is writing it now" in res.output, res.output
        try:
            PackedOutput.open(out)
        except ManifestError as exc:
            assert "is writing it now" in str(exc), exc
    if not (out / MANIFEST_NAME).exists():  # killed once it began writing: now interrupted
        res = invoke(["stats", out])
        assert res.exit_code == 1 and "interrupted pack" in res.output, res.output


def _mid_pack(complete, tmp_path) -> tuple[Path, bytes]:
    """An OUTPUT as a running pack holds it (shards, marker, no manifest), and the manifest
    bytes it will write."""
    out = _copy(complete[1], tmp_path / "o_c")
    manifest = (out / MANIFEST_NAME).read_bytes()
    (out / MANIFEST_NAME).unlink()
    (out / IN_PROGRESS_NAME).write_text("{}")
    return out, manifest


def test_stats_when_the_pack_ends_between_two_looks_reads_the_output(complete, tmp_path,
                                                                     monkeypatch):
    """No manifest at the first look; the pack writes it, drops its marker and releases its
    lock before the lock is looked at: a complete output, not an interrupted one."""
    out, manifest = _mid_pack(complete, tmp_path)

    def ends_now(directory) -> bool:
        if not (out / MANIFEST_NAME).exists():
            (out / MANIFEST_NAME).write_bytes(manifest)
            (out / IN_PROGRESS_NAME).unlink()
        return False

    monkeypatch.setattr(manifest_mod, "pack_running", ends_now)
    res = invoke(["stats", out])
    assert res.exit_code == 0, res.output


def test_stats_when_the_pack_begins_between_two_looks_says_it_is_writing(complete, tmp_path,
                                                                         monkeypatch):
    """An empty OUTPUT the pack just created: free at the first lock look, then the pack locks
    it and writes its marker before the directory is looked at."""
    out = tmp_path / "o_new"
    out.mkdir()
    calls = []

    def begins_now(directory) -> bool:
        calls.append(directory)
        if len(calls) == 1:
            (out / IN_PROGRESS_NAME).write_text("{}")
            return False
        return True

    monkeypatch.setattr(manifest_mod, "pack_running", begins_now)
    res = invoke(["stats", out])
    assert res.exit_code == 1 and "is writing it now" in res.output, res.output
    assert "interrupted" not in res.output


def test_the_loader_when_the_manifest_is_replaced_says_writing_or_reads_it(complete, tmp_path,
                                                                           monkeypatch):
    """The manifest read fails because a pack --overwrite removed it: the lock says so; and a
    pack that wrote it between the failed read and the lock look is read."""
    out, manifest = _mid_pack(complete, tmp_path)
    monkeypatch.setattr(manifest_mod, "pack_running", lambda directory: True)
    with pytest.raises(ManifestError, match="is writing it now"):
        PackedOutput.open(out)

    def ends_now(directory) -> bool:
        (out / MANIFEST_NAME).write_bytes(manifest)
        return False

    monkeypatch.setattr(manifest_mod, "pack_running", ends_now)
    assert read_manifest(out).fingerprint == read_manifest(complete[1]).fingerprint
    (out / MANIFEST_NAME).unlink()
    monkeypatch.setattr(manifest_mod, "pack_running", lambda directory: False)
    with pytest.raises(ManifestError, match="interrupted pack"):
        PackedOutput.open(out)


def test_shards_replaced_under_a_manifest_by_a_running_pack_say_writing(complete, tmp_path,
                                                                        monkeypatch):
    """pack --overwrite removes the old manifest, then the shards: a reader that read the
    manifest just before finds a shard gone, which is the running pack, not damage."""
    out = _copy(complete[1], tmp_path / "o_c")
    (out / "part-00000.parquet").unlink()
    monkeypatch.setattr(manifest_mod, "pack_running", lambda directory: True)
    with pytest.raises(ManifestError, match="is writing it now"):
        PackedOutput.open(out)
    monkeypatch.setattr(manifest_mod, "pack_running", lambda directory: False)
    with pytest.raises(ManifestError, match="shard listed in the manifest is missing"):
        PackedOutput.open(out)


def test_a_reader_probing_the_lock_as_a_pack_starts_does_not_make_it_fail(complete, tmp_path):
    """``stats`` / ``verify`` / the loader ask whether a pack runs by taking OUTPUT's lock for a
    moment; a pack starting at that instant waits for it instead of refusing "another packtool
    pack is writing this OUTPUT". A lock held for longer (a real pack) is still refused."""
    from filelock import FileLock

    from packtool.formats.manifest import LOCK_NAME
    from packtool.output import LOCK_WAIT_S

    src, _ = complete
    out = tmp_path / "o"
    out.mkdir()
    probe = FileLock(str(out / LOCK_NAME), thread_local=False)  # released by the timer
    probe.acquire()
    threading.Timer(0.3, probe.release).start()  # a probe, slowed down to be seen
    res = invoke(["pack", "-q", *OPTIONS, src, out])
    assert res.exit_code == 0, res.output

    held = tmp_path / "held"
    held.mkdir()
    other = FileLock(str(held / LOCK_NAME))
    other.acquire()
    try:
        res = invoke(["pack", "-q", *OPTIONS, src, held])
    finally:
        other.release()
    # a bare lock says nothing of its holder: neither a pack nor a tokenize is claimed
    assert res.exit_code != 0 and "another packtool run is writing" in res.output, res.output
    assert LOCK_WAIT_S <= 2  # the refusal stays prompt


@pytest.mark.parametrize("phase", ["write-shard:1", "manifest"])
def test_a_dataset_open_while_pack_overwrite_rewrites_its_output_says_so(complete, tmp_path,
                                                                        phase):
    """A dataset (and a PackedOutput: stats, verify) opened on an output that ``pack
    --overwrite`` of other options then rewrites: while that pack writes its shards (up to its
    commit) the old output is whole and read as before. Once the commit has removed it (as
    done here by hand, the pack held), reading a shard that is gone says a pack is writing the
    output and to open it again once it ends (it said the shard was missing or truncated:
    damage, repack); once that pack is killed, that a pack was interrupted there, to rerun
    before opening it again; a hash check running into it says the same as the reads."""
    from packtool.formats.manifest import check_shards
    from packtool.loader import PackedDataset

    src, done = complete
    out = _copy(done, tmp_path / "o_c")
    ds, reader = PackedDataset(out), PackedOutput.open(out)
    opened = read_manifest(out)
    last = ds[len(ds) - 1]
    with paused_pack(src, out, phase, ["--overwrite", *OPTIONS, "--seed", "5"]):
        again = ds[len(ds) - 1]
        assert repr(again) == repr(last)
        reader.decode(-1, ["input_ids"])
        check_shards(out, opened, hashes=True)
        assert PackedDataset(out)[0] is not None and read_manifest(out) == opened
        (out / MANIFEST_NAME).unlink()  # what the commit removes first, then the old shards
        (out / opened.shards[0].file).unlink()  # one this dataset has not opened yet
        with pytest.raises(ManifestError, match="a packtool pack is writing it now .*open "
                                                r"it again \(a new dataset"):
            ds[0]
        with pytest.raises(ManifestError, match="is writing it now"):
            reader.decode(0, ["input_ids"])
        with pytest.raises(ManifestError, match="is writing it now"):
            check_shards(out, opened, hashes=True)
    with pytest.raises(ManifestError, match="packed again since it was opened, by a packtool "
                                            "pack that was interrupted .*rerun that pack"):
        ds[0]


def test_a_hash_check_meeting_a_shard_rewritten_by_a_running_pack_says_writing(
        complete, tmp_path, monkeypatch):
    """``check_shards`` (stats, verify) hashing a shard that a running pack has just replaced
    by one of the same size: a pack is writing the output, not "the shard was modified"."""
    from packtool.formats.manifest import check_shards

    out = _copy(complete[1], tmp_path / "o_c")
    opened = read_manifest(out)
    shard = out / opened.shards[0].file
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    monkeypatch.setattr(manifest_mod, "pack_running", lambda directory: True)
    with pytest.raises(ManifestError, match="is writing it now"):
        check_shards(out, opened, hashes=True)
    monkeypatch.setattr(manifest_mod, "pack_running", lambda directory: False)
    with pytest.raises(ManifestError, match="sha256 differs from the manifest"):
        check_shards(out, opened, hashes=True)


def test_nothing_is_written_inside_an_output_a_pack_has_only_locked(complete, tmp_path):
    """A pack reading its input holds OUTPUT's lock and scratch, no marker or manifest yet:
    a pack, a --holdout-output or an export into a folder inside it is refused in one line
    naming it, as inside a finished output, never written there to break it."""
    src, _ = complete
    out = tmp_path / "new"
    with paused_pack(src, out, "read:0", OPTIONS, stop=signal.SIGINT):
        assert not (out / IN_PROGRESS_NAME).exists() and not (out / MANIFEST_NAME).exists()
        for args, role in [(["pack", "-q", *OPTIONS, src, out / "sub"], "OUTPUT"),
                           (["pack", "-q", *OPTIONS, "--holdout", 0.3, "--holdout-output",
                             out / "h", src, tmp_path / "t"], "--holdout-output")]:
            res = invoke(args)
            assert res.exit_code == 1, res.output
            assert res.output.strip() == (f"Error: {args[-1] if role == 'OUTPUT' else out / 'h'}"
                                          f": {role} is inside the packtool output "
                                          f"{out.resolve()}; choose a location outside it")
        res = invoke(["export", "--to", "nemo", complete[1], out / "x"])
        assert res.exit_code == 1 and res.output.startswith(
            f"Error: {out / 'x'}: DEST lies inside the packtool output {out.resolve()}: "), \
            res.output
        assert sorted(p.name for p in out.iterdir()) == [".packtool-tmp", ".packtool.lock"]
    assert not (tmp_path / "t").exists()
