"""Helpers for the end-to-end tests: run ``packtool pack`` through click's test runner, read the
shards with pyarrow, and check the output contract with an independent checker.

The checker uses only plain Python lists and the contract as written in the README (it never
calls packtool's own layout or packing functions), so a bug shared by the kernel and its twin
still shows here.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from click.testing import CliRunner

from packtool.formats.manifest import read_manifest
from packtool.cli import cli

IGNORE = -100


def write_docs(path: Path, docs, value_type=pa.int64(), column: str = "input_ids") -> Path:
    """One Parquet file, one row per document, a ``list<value_type>`` token column."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({column: pa.array(docs, pa.list_(value_type))}), path)
    return path


def write_table_as(table: pa.Table, path: Path, fmt: str) -> Path:
    """``table`` written at ``path`` as a Parquet file (``fmt`` "parquet") or an Arrow IPC
    file ("arrow"), whatever the name's extension."""
    if fmt == "parquet":
        pq.write_table(table, path)
    else:
        with pa.ipc.new_file(path, table.schema) as w:
            w.write_table(table)
    return path


def damaged_shard(path: Path, new: int, statistics: bool = True, **kw) -> Path:
    """Three row groups of int32 ids, PLAIN-encoded, uncompressed, with footer statistics
    (min/max of each row group's ids) unless ``statistics`` is False; then the stored bytes of
    id 3000 (row 3, in row group 1, neither its min nor its max: stored once, in the data
    page only) overwritten with ``new``, as a flipped disk or network byte would: the file
    still decodes, the footer is untouched."""
    docs = [[1000, 1001], [1002], [2000, 2001], [2500, 3000, 3600], [4000], [4001, 4002]]
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), path,
                   row_group_size=2, compression="none", use_dictionary=False,
                   write_statistics=statistics, **kw)
    data = bytearray(path.read_bytes())
    old = np.int32(3000).tobytes()
    assert data.count(old) == 1
    at = data.index(old)
    data[at:at + 4] = np.int32(new).tobytes()
    path.write_bytes(bytes(data))
    return path


def invoke(args, **kw):
    """``packtool ARGS`` through click's runner (exceptions are caught and reported)."""
    return CliRunner().invoke(cli, [str(a) for a in args], **kw)


def run_without_root_powers(cmd, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd`` (a list) in a process that obeys permission bits: as it is for a user, as
    root without the capabilities that override them (root reads and writes any file); skips
    the test as root without ``setpriv``."""
    import shutil

    import pytest

    cmd = list(map(str, cmd))
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root ignores permission bits and setpriv is missing")
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, **kw)


def read_output(out: Path) -> tuple[list[dict], dict]:
    """All rows of a packed output in manifest order, and the manifest."""
    manifest = read_manifest(out)
    rows: list[dict] = []
    for entry in manifest.shards:
        rows.extend(pq.read_table(out / entry.file).to_pylist())
    return rows, manifest


def pack_docs(tmp_path: Path, docs, capacity: int, *extra, value_type=pa.int64()):
    """Write ``docs``, run ``pack --no-shuffle``, return (rows, manifest); fail on a bad exit.

    The contract cases check the stored labels, so ``--labels unshifted`` is passed unless
    ``extra`` names a ``--labels`` mode (the default, ``none``, stores no labels column).
    """
    src = write_docs(tmp_path / "in" / "docs.parquet", docs, value_type)
    out = tmp_path / "out"
    if "--labels" not in [str(e) for e in extra]:
        extra = ("--labels", "unshifted", *extra)
    res = invoke(["pack", "--no-shuffle", "-q", "--capacity", capacity, *extra, src, out])
    assert res.exit_code == 0, res.output
    return read_output(out)


def finished_shards(directory: Path) -> list[str]:
    """The finished shards in an output directory, by their final names: those under them and
    those still under their pending names (``.part-00000.parquet.pending``: an interrupted
    run's, before its commit)."""
    final = {p.name for p in directory.glob("part-*.parquet")}
    waiting = {p.name[1:-len(".pending")] for p in directory.glob(".part-*.parquet.pending")}
    return sorted(final | waiting)


def pending(directory: Path, name: str) -> Path:
    """Where finished shard ``name`` waits in ``directory`` until the manifest is written."""
    from packtool.formats.manifest import pending_name

    return directory / pending_name(name)


def hash_tree(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` (relative path -> hex digest)."""
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def hash_store_tree(fs: pafs.FileSystem, prefix: str) -> dict[str, str]:
    """:func:`hash_tree` of the objects under ``prefix`` of a store (relative key -> hex
    digest)."""
    out = {}
    for info in fs.get_file_info(pafs.FileSelector(prefix, recursive=True)):
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as fh:
                out[info.path[len(prefix) + 1:]] = hashlib.sha256(fh.read()).hexdigest()
    return out


def hash_pack(directory: Path) -> dict[str, str]:
    """:func:`hash_tree` of a packed output, its manifest taken as what it records apart from
    where the other output of a ``--holdout`` pair is (``holdout_pair.partner``, which names
    a location): two runs into different places then compare equal when every other byte and
    field is (the pair id included)."""
    import json

    from packtool.formats.manifest import MANIFEST_META_KEY, MANIFEST_NAME

    tree = hash_tree(directory)
    schema = pq.read_schema(directory / MANIFEST_NAME)
    doc = json.loads(schema.metadata[MANIFEST_META_KEY])
    if "holdout_pair" in doc:
        doc["holdout_pair"] = {k: v for k, v in doc["holdout_pair"].items() if k != "partner"}
    rest = schema.with_metadata({k: v for k, v in schema.metadata.items()
                                 if k != MANIFEST_META_KEY})
    tree[MANIFEST_NAME] = hashlib.sha256(
        (json.dumps(doc, sort_keys=True) + str(rest) + repr(rest.metadata)).encode()).hexdigest()
    return tree


def segments_of(row: dict) -> list[tuple[int, int]]:
    """(start, length) of each document segment, read from ``segment_ids`` alone."""
    seg = row["segment_ids"]
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(seg) and seg[i] != 0:
        j = i
        while j < len(seg) and seg[j] == seg[i]:
            j += 1
        out.append((i, j - i))
        i = j
    return out


def check_row(row: dict, capacity: int, pad_id: int, labels: str) -> list[tuple[int, int]]:
    """Assert the output contract on one row; return its segments as (start, length)."""
    seg, pos, ids = row["segment_ids"], row["position_ids"], row["input_ids"]
    for name in ("input_ids", "segment_ids", "position_ids") + (("labels",) if labels != "none"
                                                                   else ()):
        assert len(row[name]) == capacity, f"{name} has {len(row[name])} items, not C={capacity}"
    segs = segments_of(row)
    real = sum(n for _, n in segs)
    assert segs, "a row without any document segment"
    # segment ids are 1..k in order, then padding 0 only at the tail
    assert [seg[s] for s, _ in segs] == list(range(1, len(segs) + 1))
    assert seg[real:] == [0] * (capacity - real), "padding (segment 0) only at the tail"
    assert ids[real:] == [pad_id] * (capacity - real)
    # positions restart at every segment start; the padding tail is one pseudo-segment
    for s, n in segs + ([(real, capacity - real)] if real < capacity else []):
        assert pos[s:s + n] == list(range(n)), f"positions of segment at {s} are not 0..{n - 1}"
    # cu_seqlens: boundaries of the segments, then the padding tail, ending at C
    cu = row["cu_seqlens"]
    expect_cu = [0] + [s + n for s, n in segs] + ([capacity] if real < capacity else [])
    assert cu == expect_cu
    assert all(a < b for a, b in zip(cu, cu[1:])), "cu_seqlens not strictly increasing"
    assert cu[-1] == capacity
    assert row["max_seqlen"] == max(b - a for a, b in zip(cu, cu[1:]))
    # labels: no target crosses a segment boundary
    if labels == "unshifted":
        want = [IGNORE] * capacity
        for s, n in segs:
            want[s + 1:s + n] = ids[s + 1:s + n]
        assert row["labels"] == want
    elif labels == "shifted":
        want = [IGNORE] * capacity
        for s, n in segs:
            want[s:s + n - 1] = ids[s + 1:s + n]
        assert row["labels"] == want
    else:
        assert "labels" not in row
    assert row["num_targets"] == sum(n - 1 for _, n in segs)
    if labels != "none":
        assert row["num_targets"] == sum(1 for x in row["labels"] if x != IGNORE)
    assert len(row["doc_ids"]) == len(row["doc_offsets"]) == len(segs)
    return segs


def check_output(rows, docs, capacity, *, pad_id=0, labels="unshifted", overflow="split",
                 append_eos=None):
    """Contract on every row, plus: every kept token appears exactly once, at its recorded
    document and offset; returns the multiset of real output tokens."""
    # --append-eos never doubles an EOS a document already ends with
    docs = [list(d) + ([append_eos] if append_eos is not None and d and d[-1] != append_eos
                       else []) for d in docs]
    pieces: dict[int, list[tuple[int, int]]] = {}
    out_tokens: Counter = Counter()
    for row in rows:
        segs = check_row(row, capacity, pad_id, labels)
        for (s, n), d, off in zip(segs, row["doc_ids"], row["doc_offsets"]):
            assert row["input_ids"][s:s + n] == docs[d][off:off + n], (
                f"segment of doc {d} at offset {off} does not hold that document's tokens")
            pieces.setdefault(d, []).append((off, n))
            out_tokens.update(row["input_ids"][s:s + n])
    for d, doc in enumerate(docs):
        if not doc or (overflow == "drop" and len(doc) > capacity):
            assert d not in pieces, f"document {d} should not appear"
            continue
        keep = min(len(doc), capacity) if overflow == "truncate" else len(doc)
        got = sorted(pieces.get(d, []))
        at = 0
        for off, n in got:
            assert off == at, f"document {d}: tokens {at}..{off} lost or duplicated"
            at += n
        assert at == keep, f"document {d}: {at} of {keep} tokens in the output"
    return out_tokens


def reseal(out: Path, **changes):
    """Make the manifest of ``out`` vouch again for its shards as they are now, after a test
    rewrote some (rows, row groups, bytes, sha256 and footer of every shard re-read); keyword
    ``changes`` replace manifest fields (e.g. ``labels=LabelsInfo(...)``). Returns the new
    manifest. A broken output that still loads, for the tests that feed one to a checker."""
    import dataclasses

    from packtool.formats.manifest import publish_manifest
    from packtool.output import kept_shard

    manifest = read_manifest(out)
    shards = tuple(kept_shard(out, s.file, None) for s in manifest.shards)
    manifest = dataclasses.replace(manifest, shards=shards, **changes)
    schema = pq.read_schema(out / shards[0].file) if shards else None
    meta = {k: v for k, v in (schema.metadata or {}).items() if k != b"packtool.shard"}
    publish_manifest(out, manifest, schema.with_metadata(meta))
    return manifest


def withhold_seq_idx(monkeypatch) -> None:
    """Negative control of the hybrid checks: ``packtool.loader.collate`` drops ``seq_idx``
    from every batch (a training loop that does not pass it), until the test ends."""
    import packtool.loader

    real = packtool.loader.collate

    def without_seq_idx(items):
        batch = real(items)
        del batch["seq_idx"]
        return batch

    monkeypatch.setattr(packtool.loader, "collate", without_seq_idx)


def flat_docs(docs):
    """(lengths int64[D], tokens int32[sum], starts int64[D]) of a list of token lists."""
    import numpy as np

    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    tokens = np.array([t for d in docs for t in d], dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return lengths, tokens, starts


def layout_dicts(docs, capacity, *, multiple=1, strategy="obfd", overflow="split", pad_id=0,
                 labels="unshifted", targets=None):
    """(plan, one dict of plain lists per row) of ``docs`` planned by ``pack_lengths`` and laid
    out by ``layout_rows``: the kernels' rows in the shape the reference twins give."""
    import numpy as np

    from packtool.core import layout_rows, pack_lengths

    lengths, tokens, starts = flat_docs(docs)
    plan = pack_lengths(lengths, capacity, strategy=strategy, overflow=overflow,
                        segment_multiple=multiple)
    flags = None if targets is None else np.array([f for t in targets for f in t], np.uint8)
    out = layout_rows(plan, np.arange(plan.num_rows), tokens, starts, pad_id=pad_id,
                      labels=labels, targets=flags)
    rows = []
    for k in range(plan.num_rows):
        segs = slice(out.seg_offsets[k], out.seg_offsets[k + 1])
        rows.append({
            "input_ids": out.input_ids[k].tolist(),
            "segment_ids": out.segment_ids[k].tolist(),
            "position_ids": out.position_ids[k].tolist(),
            "labels": None if out.labels is None else out.labels[k].tolist(),
            "cu_seqlens": out.cu_seqlens(k).tolist(),
            **({"cu_seqlens_unpadded": out.cu_seqlens_unpadded(k).tolist()}
               if multiple > 1 else {}),
            "max_seqlen": int(out.max_seqlen[k]),
            "num_targets": int(out.num_targets[k]),
            "doc_ids": out.doc_ids[segs].tolist(),
            "doc_offsets": out.doc_offsets[segs].tolist(),
        })
    return plan, rows


def no_padding_block(batch, dev):
    """B22 negative control for ``run_verify(attend_overrides=...)``: attention written out
    with a mask that leaves padding query rows without a key (softmax of a row of -inf is
    NaN), so the ``finite`` check must fail."""
    import torch

    seg = batch["segment_ids"].to(dev)
    n = seg.shape[1]
    m = ((seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
         & torch.ones(n, n, dtype=torch.bool, device=dev).tril())[:, None]

    def attend(q, k, v):
        s = (q @ k.transpose(-1, -2)).masked_fill(~m, float("-inf"))
        return torch.softmax(s / q.shape[-1] ** 0.5, dim=-1) @ v

    return attend


@contextmanager
def paused_pack(src, out, phase: str, options=(), stop: int = signal.SIGKILL):
    """``packtool pack -q OPTIONS SRC OUT`` as a process, held at the test pause ``phase``
    (``PACKTOOL_TEST_PAUSE_AT``): yields the process once it announced the pause; on the way
    out it is sent ``stop`` (SIGKILL: it dies, asserted; SIGINT or SIGTERM: it exits 128 + the
    signal, asserted, and what it printed on stderr after the pause is left in
    ``proc.err``) and reaped, with a 120 s watchdog throughout."""
    env = dict(os.environ, PACKTOOL_TEST_PAUSE_AT=phase)
    proc = subprocess.Popen([sys.executable, "-m", "packtool", "pack", "-q", *map(str, options),
                             str(src), str(out)], stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        line = proc.stderr.readline()
        assert f"test pause at {phase}" in line, f"no pause at {phase}: {line!r}"
        yield proc
        os.kill(proc.pid, stop)
        code = proc.wait()
        proc.err = proc.stderr.read()
        assert code == (-stop if stop == signal.SIGKILL else 128 + stop), proc.err
    finally:
        watchdog.cancel()
        proc.kill()
        proc.stderr.close()


def stopped_at(args, phase: str, sig: int = signal.SIGINT, *,
               at_pause=None) -> tuple[int, str]:
    """``packtool ARGS`` as a process, held at the test pause ``phase``
    (``PACKTOOL_TEST_PAUSE_AT``; ``start``: before the command touched its OUTPUT), then sent
    ``sig`` (after ``at_pause()``, a check of what the paused run left, when given); returns
    its exit status and what it printed on stderr after the pause (120 s watchdog)."""
    env = dict(os.environ, PACKTOOL_TEST_PAUSE_AT=phase)
    proc = subprocess.Popen([sys.executable, "-m", "packtool", *map(str, args)],
                            stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        line = proc.stderr.readline()
        assert f"test pause at {phase}" in line, f"no pause at {phase}: {line!r}"
        if at_pause is not None:
            at_pause()
        os.kill(proc.pid, sig)
        code = proc.wait()
        return code, proc.stderr.read()
    finally:
        watchdog.cancel()
        proc.kill()
        proc.stderr.close()


_SIGNAL_AFTER_RUN = """
import os, signal, sys, time
import {module} as m
original = m.{fn}

def then_signals(*args, **kwargs):
    res = original(*args, **kwargs)  # the run is over: its output is complete
    for _ in range({count}):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)  # the handler runs here, in the main thread
    return res

m.{fn} = then_signals
sys.argv = ["packtool", *sys.argv[1:]]
from packtool.__main__ import main
main()
"""


def signals_after_run(module: str, fn: str, count: int, args) -> subprocess.CompletedProcess:
    """``packtool ARGS`` as a process whose ``module.fn`` (the run: ``run_pack``,
    ``upgrade_manifest``, ...) sends the process ``count`` SIGINTs once it has returned, while
    the command prints its summary."""
    code = _SIGNAL_AFTER_RUN.format(module=module, fn=fn, count=count)
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=300)


# -- a store that refuses or drops the reads of objects it lists ----------------------------

#: What pyarrow's S3 filesystem raises (an OSError) when the store refuses a read ...
DENIED_TEXT = ("When reading information for key 'corpus/a.parquet' in bucket 'b': AWS Error "
               "ACCESS_DENIED during HeadObject operation: No response body.")
#: ... and when the server has gone
DOWN_TEXT = ("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 7, Couldn't "
             "connect to server")


class _Dropping:
    """A file of the store whose reads fail with ``text`` where ``fails(pos, n, size)``."""

    def __init__(self, f, text, fails):
        self.f, self.text, self.fails, self.closed = f, text, fails, False

    def seek(self, pos, whence=0):
        return self.f.seek(pos, whence)

    def tell(self):
        return self.f.tell()

    def read(self, n=-1):
        pos, size = self.f.tell(), self.f.size()
        if self.fails(pos, size - pos if n is None or n < 0 else n, size):
            raise OSError(self.text)
        return self.f.read(n)

    def readable(self):
        return True

    def seekable(self):
        return True

    def writable(self):
        return False

    def close(self):
        self.closed = True
        self.f.close()


class _FaultyStore(pafs.FileSystemHandler):
    """The store itself, but its data objects (``.parquet``, ``.arrow``, ``.jsonl``, not
    packtool's own ``.packtool-*``; listing works) fail as a store fails:

    - ``head``: every request about the object is refused (HEAD and GET answered 403 or the
      server gone: ``text``);
    - ``footer``: the object opens, the read of its end fails (a Parquet footer);
    - ``body``: the object opens and its end reads, any other read fails (the server went down
      once the footer was read: the row groups)."""

    def __init__(self, fs, fault, text):
        self.fs, self.fault, self.text = fs, fault, text

    def _data(self, path):
        name = path.rstrip("/").rpartition("/")[2]
        return name.endswith((".parquet", ".arrow", ".jsonl")) and not name.startswith(".")

    def _refused(self, path):
        return self.fault == "head" and self._data(path)

    def get_type_name(self):
        return "faulty"

    def normalize_path(self, path):
        return self.fs.normalize_path(path)

    def get_file_info(self, paths):
        if any(self._refused(p) for p in paths):
            raise OSError(self.text)
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def _wrap(self, path, f):
        if not self._data(path) or self.fault == "head":
            return f
        if self.fault == "footer":
            def fails(pos, n, size):
                return pos + n >= size
        else:
            def fails(pos, n, size):
                return pos + n < size
        return pa.PythonFile(_Dropping(f, self.text, fails), mode="r")

    def open_input_file(self, path):
        if self._refused(path):
            raise OSError(self.text)
        return self._wrap(path, self.fs.open_input_file(path))

    def open_input_stream(self, path, *args):
        if self._refused(path):
            raise OSError(self.text)
        if not self._data(path) or self.fault != "body":
            return self.fs.open_input_stream(path, *args)
        return self._wrap(path, self.fs.open_input_file(path))

    def create_dir(self, path, recursive):
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        self.fs.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path, metadata=metadata)


def faulty_store(monkeypatch, fault, text):
    """From here on, every store this process opens fails as :class:`_FaultyStore` says
    (``fault``, with pyarrow's ``text``)."""
    from packtool import location
    from packtool.formats import filesystem

    real = filesystem.from_uri

    def from_uri(root):
        fs, inner = real(root)
        return pafs.PyFileSystem(_FaultyStore(fs, fault, text)), inner

    monkeypatch.setattr(filesystem, "from_uri", from_uri)
    monkeypatch.setattr(location, "_FS", {})


_STORE_LINES = {DENIED_TEXT: "the store refused the credentials",
                DOWN_TEXT: "cannot reach the store"}


def one_store_line(res, uri, text):
    """``res`` failed with exit 1 and one line naming object ``uri`` and the store's fault,
    never the object's content."""
    assert res.exit_code == 1, res.output
    [line] = res.output.strip().splitlines()
    assert line.startswith(f"Error: {uri}: ") and _STORE_LINES[text] in line, line
    for blame in ("empty", "damaged", "truncated", "not a readable", "regenerate"):
        assert blame not in line, line
    return line
