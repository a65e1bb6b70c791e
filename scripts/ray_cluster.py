"""A Ray cluster of three nodes on this one machine, `packtool pack --engine ray` across it, and
faults on it, each checked against an undisturbed run byte for byte.

    python scripts/ray_cluster.py                       # cluster, reference runs, every fault
    python scripts/ray_cluster.py --faults kill-worker,stop-node --docs 4000
    python scripts/ray_cluster.py --s3                  # INPUT on a local S3 server (moto)
    python scripts/ray_cluster.py --output s3           # INPUT and OUTPUT on it: nodes share
                                                        # nothing but the store
    python scripts/ray_cluster.py --output both         # both places, one cluster

The cluster: a head started with ``ray start --head`` (no CPUs: it runs only the driver, like a
head node kept free of work) and two nodes joined with ``ray start --address``, each with its
own ``--temp-dir``, its own ports, 1 CPU and a custom resource naming it, so two tasks (1 CPU
each) run on two different nodes. Every Ray process runs under ``nice``. Each node is one
``ray start --block`` process in its own session; stopping a node kills that process and all
of its descendants (raylet, agents, workers), and the cluster is always stopped this way at
the end, even on failure (never ``ray stop``, which would stop every Ray on the machine).
Each node gets its own ``TMPDIR`` (its tasks' temporary files: its own disk), and so does the
driver; with OUTPUT on the S3 server nothing else is shared, and a watcher checks that no
packtool file ever appears in the driver's ``TMPDIR`` and none is left on a node after an
undisturbed run.

The runs (``packtool pack --engine ray --ray-address HEAD``, each a separate driver process):

- reference: an undisturbed run on the cluster, in each OUTPUT place (a directory, or a prefix
  on the S3 server, read back object by object), which must equal ``--engine local`` into a
  directory, shards and manifest, with nothing else left under OUTPUT;
- ``kill-worker``: the worker writing output shard 1 is SIGKILLed in the middle of the shard
  (after its first row group); Ray retries the task;
- ``kill-driver``: the driver is SIGKILLed while a window task runs and at least one window is
  finished; the same command, rerun, reuses the finished windows;
- ``data-error``: one read part holds a negative token id while another read task is held
  running; the run must stop with the one-line error at once, cancel the held task (its worker
  is gone when the command returns), and leave an existing OUTPUT as it was;
- ``stop-node``: the whole node running a window task is killed (raylet, agents, workers); the
  other node finishes the run. Run last in a place; the node is started again when another
  place's faults follow.

Where a fault must land at a given moment, the pack's test hook holds one task there
(``PACKTOOL_TEST_PAUSE_AT`` with ``PACKTOOL_TEST_PAUSE_ONCE``, which records the pid of the held
worker, on whatever node it runs); the fault then kills that process, its node or the driver.

Prints one line per run (seconds, exit status, result) and exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

FAULTS = ("kill-worker", "kill-driver", "data-error", "stop-node")
BIN = Path(sys.executable).parent
CAPACITY = 256


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(proc: psutil.Process, sig=signal.SIGKILL) -> list[psutil.Process]:
    """Send ``sig`` to ``proc`` and every descendant; returns them."""
    try:
        procs = proc.children(recursive=True) + [proc]
    except psutil.NoSuchProcess:
        return []
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    return procs


@dataclass
class Node:
    """One ``ray start --block`` process (a Ray node) and its temp dir."""

    name: str
    proc: subprocess.Popen
    temp_dir: Path
    log: Path
    alive: bool = True
    args: list = field(default_factory=list)  #: its ``ray start`` options (to restart it)

    def processes(self) -> list[psutil.Process]:
        """The node's processes: the ``ray start`` process and all its descendants."""
        try:
            p = psutil.Process(self.proc.pid)
            return [p] + p.children(recursive=True)
        except psutil.NoSuchProcess:
            return []


@dataclass
class Cluster:
    """A head and ``workers`` more Ray nodes on this machine; a context manager that always
    stops every process it started.

    Args:
        root: a short directory path (Ray's socket paths must stay under 108 bytes).
        workers: nodes besides the head, each with ``cpus`` CPUs.
        env: environment of every Ray process (the tasks inherit it: object-store credentials).
        head_cpus: CPUs of the head (0: it runs only the driver).
        cwd: the working directory of every ``ray start`` (its workers' too), None: this one.
    """

    root: Path
    workers: int = 2
    cpus: int = 1
    env: dict = field(default_factory=dict)
    head_cpus: int = 0
    cwd: Path | None = None
    nodes: list = field(default_factory=list)
    address: str = ""
    seen: list = field(default_factory=list)  #: every process stopped (to check none is left)

    def _start(self, name: str, args: list[str], timeout: float = 180.0) -> Node:
        temp = self.root / name
        temp.mkdir(parents=True, exist_ok=True)
        tmpdir = self.root / "tmp" / name  # the node's own disk: its tasks' TMPDIR
        tmpdir.mkdir(parents=True, exist_ok=True)
        log = self.root / f"{name}.log"
        ports = ["--node-manager-port", free_port(), "--object-manager-port", free_port(),
                 "--dashboard-agent-listen-port", free_port(),
                 "--dashboard-agent-grpc-port", free_port(),
                 "--runtime-env-agent-port", free_port(), "--metrics-export-port", free_port()]
        cmd = ["nice", "-n", "10", str(BIN / "ray"), "start", "--block", "--temp-dir", str(temp),
               "--node-ip-address", "127.0.0.1", "--object-store-memory", str(100 << 20),
               "--disable-usage-stats", *map(str, ports), *args]
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **self.env, TMPDIR=str(tmpdir))
        with open(log, "wb") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, cwd=self.cwd)
        node = Node(name, proc, temp, log, args=list(args))
        self.nodes.append(node)
        t0 = time.monotonic()
        while b"Ray runtime started" not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"Ray node {name} did not start; see {log}:\n"
                                   + log.read_text(errors="replace")[-2000:])
            time.sleep(0.2)
        return node

    def __enter__(self) -> "Cluster":
        self.root.mkdir(parents=True, exist_ok=True)
        # token authentication (Ray's default for a new head), with a token of this cluster's
        # own: every node and every driver gets it through the environment
        token = self.root / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        try:
            port = free_port()
            self._start("head", ["--head", "--port", str(port), "--num-cpus",
                                 str(self.head_cpus),
                                 "--include-dashboard", "false",
                                 "--resources", json.dumps({"head": 1})])
            self.address = f"127.0.0.1:{port}"
            for k in range(1, self.workers + 1):
                self._start(f"node{k}", ["--address", self.address, "--num-cpus",
                                         str(self.cpus),
                                         "--min-worker-port", "0", "--max-worker-port", "0",
                                         "--resources", json.dumps({f"node{k}": 1})])
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def node_of(self, pid: int) -> Node | None:
        """The node whose process tree holds ``pid``."""
        for node in self.nodes:
            if node.alive and any(p.pid == pid for p in node.processes()):
                return node
        return None

    def kill_node(self, node: Node) -> None:
        """Kill a node at once: its ``ray start`` process and every descendant (SIGKILL)."""
        procs = node.processes()
        self.seen += procs
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        node.proc.wait(timeout=10)
        node.alive = False

    def restart(self, node: Node) -> Node:
        """Start a killed node again, with its name and options (a replacement machine)."""
        self.nodes.remove(node)
        return self._start(node.name, node.args)

    def stop(self) -> None:
        """Stop every node, workers first, head last: SIGTERM, then SIGKILL what is left."""
        for node in reversed(self.nodes):
            procs = node.processes()
            self.seen += procs
            for p in procs[:1]:
                try:
                    p.terminate()
                except psutil.NoSuchProcess:
                    pass
            _, left = psutil.wait_procs(procs, timeout=15)
            for p in left:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(left, timeout=10)
            try:
                node.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            node.alive = False
        self.nodes.clear()


# --- corpus and runs ---------------------------------------------------------------------------

def make_corpus(root: Path, *, files: int, docs: int, seed: int = 0, bad_file: int | None = None):
    """``files`` Parquet files of ``docs`` web-like documents in total (lengths lognormal,
    median about 60 tokens at this capacity, a few longer than it), 3 row groups each.
    ``bad_file``: that file's last document gets a negative id (a data error)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    per = -(-docs // files)
    for i in range(files):
        lengths = np.clip(rng.lognormal(4.1, 0.9, per).astype(np.int64), 1, 3 * CAPACITY)
        ids = rng.integers(0, 50_000, int(lengths.sum()), dtype=np.int64)
        if bad_file == i:
            ids[-1] = -7
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        col = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))
        pq.write_table(pa.table({"input_ids": col}), root / f"part-{i:03d}.parquet",
                       row_group_size=-(-per // 3))
    return root


def _store(uri: str):
    """(pyarrow filesystem, path inside it) of an ``s3://`` URI (endpoint from the environment)."""
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


def tree_hashes(out) -> dict:
    """sha256 of every file in OUTPUT (shards and the manifest), by name. An ``s3://`` OUTPUT
    is listed recursively, so any object left beside them (scratch, lock) shows as an entry."""
    if isinstance(out, str) and "://" in out:
        import pyarrow.fs as pafs

        fs, base = _store(out)
        got = {}
        for info in fs.get_file_info(pafs.FileSelector(base, recursive=True,
                                                       allow_not_found=True)):
            if info.type == pafs.FileType.File:
                with fs.open_input_stream(info.path) as fh:
                    got[info.path[len(base) + 1:]] = hashlib.sha256(fh.read()).hexdigest()
        return dict(sorted(got.items()))
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(out).iterdir()) if p.is_file()}


def copy_tree(src, dst) -> None:
    """Copy OUTPUT ``src`` to ``dst`` (both directories or both ``s3://`` prefixes)."""
    if isinstance(src, str) and "://" in src:
        import pyarrow.fs as pafs

        fs, a = _store(src)
        _, b = _store(dst)
        pafs.copy_files(a, b, source_filesystem=fs, destination_filesystem=fs)
    else:
        shutil.copytree(src, dst)


def windows_done(out) -> int:
    """Windows finished in OUTPUT's scratch (``window-*/done.json``)."""
    if isinstance(out, str) and "://" in out:
        import pyarrow.fs as pafs

        fs, base = _store(out)
        infos = fs.get_file_info(pafs.FileSelector(f"{base}/.packtool-tmp", recursive=True,
                                                   allow_not_found=True))
        return sum(i.path.endswith("/done.json") and "/window-" in i.path for i in infos)
    return sum((d / "done.json").is_file() for d in (Path(out) / ".packtool-tmp").glob("window-*"))


def packtool_files(where: Path) -> list[str]:
    """Names of packtool's temporary files and directories under ``where``."""
    return sorted(p.name for p in where.rglob("*") if "packtool" in p.name) \
        if where.is_dir() else []


@dataclass
class Runner:
    """Runs ``packtool pack`` with fixed options against the cluster (or locally)."""

    cluster: Cluster
    root: Path
    window_docs: int
    rows_per_shard: int
    env: dict = field(default_factory=dict)
    count: int = 0
    store: str | None = None  #: an ``s3://`` prefix: OUTPUTs go there, else under ``root``
    ref: object = None  #: OUTPUT of the undisturbed cluster run in this place

    def fresh(self, name: str):
        """A new OUTPUT (path, or URI in the store) and hold-marker path for one run."""
        self.count += 1
        held = self.root / f"held-{name}-{'s3' if self.store else 'dir'}-{self.count}"
        if self.store:
            return f"{self.store}/out-{name}-{self.count}", held
        return self.root / f"out-{name}-{self.count}", held

    def argv(self, inputs, out, *, engine="ray", extra=()) -> list[str]:
        args = [str(BIN / "packtool"), "pack", "--json", "--capacity", str(CAPACITY),
                "--window-docs", str(self.window_docs), "--rows-per-shard",
                str(self.rows_per_shard), "--engine", engine, *extra]
        if engine == "ray":
            args += ["--ray-address", self.cluster.address]
        return ["nice", "-n", "10", *args, *map(str, inputs), str(out)]

    def popen(self, inputs, out, *, pause=None, once=None, **kw) -> subprocess.Popen:
        driver_tmp = self.root / "tmp" / "driver"  # watched: no packtool file may appear
        driver_tmp.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **self.env, TMPDIR=str(driver_tmp))
        for k in ("PACKTOOL_TEST_PAUSE_AT", "PACKTOOL_TEST_PAUSE_ONCE"):
            env.pop(k, None)
        if pause:
            env.update(PACKTOOL_TEST_PAUSE_AT=pause, PACKTOOL_TEST_PAUSE_ONCE=str(once))
        return subprocess.Popen(self.argv(inputs, out, **kw), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def run(self, inputs, out, timeout=300, **kw) -> subprocess.CompletedProcess:
        p = self.popen(inputs, out, **kw)
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            raise RuntimeError(f"pack did not end in {timeout} s:\n{se[-3000:]}")
        return subprocess.CompletedProcess(p.args, p.returncode, so, se)


def wait_pid(marker: Path, proc: subprocess.Popen | None = None, timeout=240.0) -> int:
    """The pid a held task wrote to ``marker`` (waits for it)."""
    t0 = time.monotonic()
    while True:
        try:
            text = marker.read_text().strip()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"pack ended (rc {proc.returncode}) before the task was held:\n"
                               + proc.stderr.read()[-3000:])
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"no task was held within {timeout} s ({marker})")
        time.sleep(0.1)


def gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` ends within ``timeout`` seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    note: str


def _finish(name, t0, checks: dict, note="") -> Result:
    bad = [k for k, v in checks.items() if not v]
    return Result(name, not bad, time.monotonic() - t0,
                  note + ("" if not bad else f" FAILED: {', '.join(bad)}"))


def fault_kill_worker(r: Runner, inputs, ref: dict) -> Result:
    t0, (out, marker) = time.monotonic(), r.fresh("kill-worker")
    p = r.popen(inputs, out, pause="write-shard:1", once=marker)
    pid = wait_pid(marker, p)
    node = r.cluster.node_of(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        p.kill()
        so, se = p.communicate()
        return Result("kill-worker", False, time.monotonic() - t0,
                      f"FAILED: held worker {pid} gone before the kill: {se.strip()[-800:]}")
    so, se = p.communicate(timeout=300)
    return _finish("kill-worker", t0, {
        "exit 0": p.returncode == 0, "same bytes": p.returncode == 0 and tree_hashes(out) == ref,
        "worker was on a worker node": node is not None and node.name != "head"},
        f"SIGKILLed worker {pid} on {node.name if node else '?'} while it wrote shard 1")


def fault_kill_driver(r: Runner, inputs, ref: dict) -> Result:
    t0, (out, marker) = time.monotonic(), r.fresh("kill-driver")
    windows = len(ref_windows(r, inputs))
    held = min(2, windows - 1)
    p = r.popen(inputs, out, pause=f"plan:{held}", once=marker)
    pid = wait_pid(marker, p)
    deadline = time.monotonic() + 240
    while not windows_done(out):
        if time.monotonic() > deadline or p.poll() is not None:
            break
        time.sleep(0.2)
    finished = windows_done(out)
    p.kill()  # SIGKILL: no cleanup at all
    p.communicate()
    worker_gone = gone(pid, 60)  # Ray ends the dead driver's tasks
    again = r.run(inputs, out)
    report = json.loads(again.stdout) if again.returncode == 0 else {}
    return _finish("kill-driver", t0, {
        "a window finished before the kill": finished >= 1,
        "held task ended with its driver": worker_gone,
        "rerun exit 0": again.returncode == 0,
        "rerun reused the finished windows": report.get("windows_reused", 0) >= finished >= 1,
        "same bytes": again.returncode == 0 and tree_hashes(out) == ref},
        f"SIGKILLed the driver with {finished} of {windows} windows finished; the rerun reused "
        f"{report.get('windows_reused')}")


def fault_data_error(r: Runner, bad_inputs, ref_out) -> Result:
    t0, (out, marker) = time.monotonic(), r.fresh("data-error")
    copy_tree(ref_out, out)  # an existing finished OUTPUT that must stay as it was
    before = tree_hashes(out)
    p = r.popen(bad_inputs, out, pause="read:0", once=marker, extra=("--overwrite",))
    pid = wait_pid(marker, p)
    try:
        so, se = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:  # the held task was waited for instead of cancelled
        p.kill()
        so, se = p.communicate()
    lines = [ln for ln in se.splitlines() if ln.strip()]
    return _finish("data-error", t0, {
        "exit 1": p.returncode == 1,
        "one-line error naming file and row": (len(lines) == 1 and lines[0].startswith("Error:")
                                               and ".parquet: row" in lines[0]),
        "held task cancelled before exit": not psutil.pid_exists(pid)
        or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
        "OUTPUT as before (no scratch, no lock)": tree_hashes(out) == before
        and (r.store is not None or not (out / ".packtool-tmp").exists())},
        f"{lines[0] if lines else '(no error line)'}")


def fault_stop_node(r: Runner, inputs, ref: dict, restart: bool = False) -> Result:
    t0, (out, marker) = time.monotonic(), r.fresh("stop-node")
    p = r.popen(inputs, out, pause="plan:1", once=marker)
    pid = wait_pid(marker, p)
    node = r.cluster.node_of(pid)
    if node is None or node.name == "head":
        p.kill()
        p.communicate()
        return Result("stop-node", False, time.monotonic() - t0, "held task not on a worker node")
    r.cluster.kill_node(node)
    so, se = p.communicate(timeout=300)
    if restart:  # more runs follow: the cluster gets its node back
        r.cluster.restart(node)
    return _finish("stop-node", t0, {
        "exit 0": p.returncode == 0, "same bytes": p.returncode == 0 and tree_hashes(out) == ref},
        f"killed node {node.name} (all its processes) while it ran window 1"
        + ("" if p.returncode == 0 else f": {se.strip().splitlines()[-1:]}"))


def ref_windows(r: Runner, inputs) -> list:
    """The windows of the undisturbed run (from its manifest)."""
    from packtool.formats.manifest import read_manifest

    return [w.to_dict() for w in read_manifest(r.ref).windows]


class Watch:
    """Polls directories in a thread and records every packtool file seen in each."""

    def __init__(self, dirs: dict):
        import threading

        self.dirs, self.seen = dirs, {k: set() for k in dirs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for k, d in self.dirs.items():
                try:
                    self.seen[k].update(packtool_files(d))
                except OSError:  # a file went away while listed
                    pass
            self._stop.wait(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


PLACES = ("dir", "s3")


def run_all(root: Path, *, faults=FAULTS, docs: int = 6000, files: int = 6,
            window_docs: int = 1000, rows_per_shard: int = 64, s3: str | None = None,
            places=("dir",), fault_places=None, log=print) -> list[Result]:
    """Start the cluster under ``root``, run the reference runs and ``faults``, stop it.

    Args:
        s3: endpoint URL of an S3-compatible server: INPUT is uploaded there and read as
            ``s3://`` by every node (credentials ``testing``); None: a local directory.
        places: where OUTPUT goes in the undisturbed cluster runs, each compared with
            ``--engine local`` into a directory: ``dir`` (a directory under ``root``, which
            every node of this machine sees) and ``s3`` (a prefix on the S3 server: the nodes
            then share nothing but the store; needs ``s3``).
        fault_places: the places where every fault runs (default: ``places``).

    Returns:
        one :class:`Result` per run (reference runs first).
    """
    env = {}
    src = make_corpus(root / "in", files=files, docs=docs)
    bad = make_corpus(root / "in-bad", files=files, docs=docs, bad_file=files - 1)
    inputs, bad_inputs = [src], [bad]
    if "s3" in places and not s3:
        raise ValueError("OUTPUT on S3 needs the S3 server (s3=URL)")
    if s3:
        import pyarrow.fs as pafs

        env = {"AWS_ENDPOINT_URL": s3, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}
        os.environ.update(env)  # this script reads the outputs back from the store too
        fs = pafs.S3FileSystem(endpoint_override=s3, access_key="testing", secret_key="testing",
                               region="us-east-1", allow_bucket_creation=True)
        fs.create_dir("corpus")
        fs.create_dir("packed")
        for d in (src, bad):
            for f in sorted(d.iterdir()):
                pafs.copy_files(str(f), f"corpus/{d.name}/{f.name}",
                                destination_filesystem=fs)
        inputs, bad_inputs = ["s3://corpus/in/"], ["s3://corpus/in-bad/"]
    results = []
    t0 = time.monotonic()
    cluster = Cluster(root / "ray", env=env)
    try:
        _runs(cluster, root, inputs, bad_inputs, faults, window_docs, rows_per_shard, results,
              log, t0, list(places), list(places if fault_places is None else fault_places))
    finally:
        cluster.stop()
        seen = cluster.seen
        left = [p.pid for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        results.append(Result("cluster stopped", not left, 0.0,
                              f"{len(seen)} processes stopped" if not left
                              else f"FAILED: still running: {left}"))
        log(_line(results[-1]))
    return results


def _runs(cluster, root, inputs, bad_inputs, faults, window_docs, rows_per_shard, results,
          log, t0, places, fault_places):
    def add(res):
        results.append(res)
        log(_line(res))

    with cluster:
        log(f"cluster up in {time.monotonic() - t0:.1f} s at {cluster.address}: "
            + ", ".join(n.name for n in cluster.nodes))
        node_tmp = {n.name: cluster.root / "tmp" / n.name for n in cluster.nodes
                    if n.name != "head"}
        runners = {}
        for place in dict.fromkeys(places + fault_places):
            runners[place] = Runner(cluster, root, window_docs, rows_per_shard, cluster.env,
                                    store="s3://packed" if place == "s3" else None)
        any_r = runners[places[0]]
        with Watch({"driver": root / "tmp" / "driver"}) as driver_watch:
            t = time.monotonic()
            local = any_r.run(inputs, root / "out-local", engine="local",
                              extra=("--workers", "1"))
            add(Result("local engine", local.returncode == 0, time.monotonic() - t,
                       "into a directory, 1 worker" if local.returncode == 0
                       else local.stderr.strip()[-300:]))
            if local.returncode != 0:
                return
            want = tree_hashes(root / "out-local")
            for place in places:
                r = runners[place]
                r.ref = r.fresh("ref")[0]
                t = time.monotonic()
                with Watch(node_tmp) as nodes_watch:
                    ref_run = r.run(inputs, r.ref)
                ok = ref_run.returncode == 0
                got = tree_hashes(r.ref) if ok else {}
                left = {k: packtool_files(d) for k, d in node_tmp.items()}
                used = sum(len(v) for v in nodes_watch.seen.values())
                checks = {"exit 0": ok, "same bytes as --engine local": got == want,
                          "no packtool file left on the nodes": not any(left.values())}
                add(_finish(f"cluster, undisturbed, {place}", t, checks,
                            f"{len(got) - 1} shards + manifest"
                            + (f"; nodes' TMPDIR held {used} packtool temporaries during the "
                               "run, none after" if place == "s3" else "")
                            + ("" if ok else f": {ref_run.stderr.strip()[-500:]}")))
            for k, place in enumerate(fault_places):
                r = runners[place]
                if r.ref is None or tree_hashes(r.ref) != want:
                    add(Result(f"faults, {place}", False, 0.0, "no undisturbed run to compare"))
                    continue
                for name in faults:
                    try:
                        if name == "kill-worker":
                            res = fault_kill_worker(r, inputs, want)
                        elif name == "kill-driver":
                            res = fault_kill_driver(r, inputs, want)
                        elif name == "data-error":
                            res = fault_data_error(r, bad_inputs, r.ref)
                        elif name == "stop-node":
                            res = fault_stop_node(r, inputs, want,
                                                  restart=k < len(fault_places) - 1)
                        else:
                            raise ValueError(f"unknown fault {name!r}; choose from "
                                             f"{', '.join(FAULTS)}")
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        res = Result(name, False, 0.0, f"FAILED: {exc}")
                    res.name = f"{res.name}, {place}"
                    add(res)
        seen = sorted(driver_watch.seen["driver"])
        add(Result("driver TMPDIR", not seen, 0.0,
                   "no packtool file appeared in the driver's TMPDIR during any run" if not seen
                   else f"FAILED: the driver wrote {seen[:5]}"))


def _line(r: Result) -> str:
    return f"{'ok  ' if r.ok else 'FAIL'} {r.name:<30} {r.seconds:6.1f} s  {r.note}"


def _moto():
    exe = shutil.which("moto_server", path=str(BIN))
    port = free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import urllib.request

    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto_server did not start")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help=f"comma-separated, in order (default: {','.join(FAULTS)})")
    ap.add_argument("--docs", type=int, default=6000)
    ap.add_argument("--files", type=int, default=6)
    ap.add_argument("--window-docs", type=int, default=1000)
    ap.add_argument("--rows-per-shard", type=int, default=64)
    ap.add_argument("--s3", action="store_true", help="INPUT on a local S3 server (moto)")
    ap.add_argument("--output", default="dir", choices=("dir", "s3", "both"),
                    help="where OUTPUT goes: a directory, a prefix on the S3 server (implies "
                         "--s3; the nodes share nothing but the store), or both, one after the "
                         "other on the same cluster (default: dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="ptc-", dir="/tmp"))
    moto = None
    try:
        url = None
        places = list(PLACES) if a.output == "both" else [a.output]
        if a.s3 or "s3" in places:
            moto, url = _moto()
        results = run_all(root, faults=[f for f in a.faults.split(",") if f], docs=a.docs,
                          files=a.files, window_docs=a.window_docs,
                          rows_per_shard=a.rows_per_shard, s3=url, places=places)
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(timeout=10)
        if a.keep:
            print(f"work directory kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
