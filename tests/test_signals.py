"""Ctrl-C and SIGTERM reach a run however the kernel delivers them.

A signal sent to the process goes to any thread that does not block it: a worker, one of
pyarrow's or tqdm's threads. That thread only notes it; Python runs the handler in the main
thread when the main thread next executes bytecode. A main thread blocked in a wait without a
timeout never does, so a pack paused at a point that waits for the stop (or a long task) went
on as if no signal had come (a CI run hung until its watchdog killed it, 1 time in about 100).
These tests send the signal to a bystander thread on purpose.
"""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import packtool

# the task waits up to LATE s for the stop; a stop that came from the handler comes far sooner
LATE = 20

SCRIPT = """
import signal, sys, threading, time
from packtool.signals import STOP, interruptible, result
from packtool.engines.local import LocalEngine
from concurrent.futures import ThreadPoolExecutor

bystander = threading.Thread(target=time.sleep, args=(60,), daemon=True)
bystander.start()

def task(i):
    time.sleep(0.5)  # the main thread is waiting by now
    signal.pthread_kill(bystander.ident, signal.SIGINT)  # not the main thread
    t = time.monotonic()
    while not STOP.is_set() and time.monotonic() - t < {late}:
        time.sleep(0.01)
    if not STOP.is_set():
        return "late"
    raise KeyboardInterrupt

t0 = time.monotonic()
try:
    with interruptible():
        if sys.argv[1] == "engine":
            print(list(LocalEngine(workers=2).map(task, [(0,), (1,)])))
        else:
            with ThreadPoolExecutor(1) as pool:
                print(result(pool.submit(task, 0)))
except KeyboardInterrupt:
    print("stopped after %.1f s" % (time.monotonic() - t0))
"""


@pytest.mark.parametrize("waiter", ["engine", "result"])
def test_a_signal_that_a_bystander_thread_receives_stops_the_run_at_once(waiter):
    """The local engine's map (what every pack phase runs) and :func:`packtool.signals.result`
    (the reader's read-ahead, verify's hashes): the main thread notices the signal within a
    fraction of a second, sets STOP, and the task stops. Without the polling wait the main
    thread slept until the task gave up ``LATE`` seconds later."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(late=LATE), waiter],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith("stopped after"), out
    assert float(out.split()[2]) < LATE / 2, out


def test_every_wait_for_a_future_goes_through_signals_result():
    """No ``.result()`` of a future anywhere else in packtool: each one is a main-thread wait
    that a signal delivered to another thread does not interrupt."""
    root = Path(packtool.__file__).parent
    bare = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "result" and path.name != "signals.py"):
                bare.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not bare, bare


_SIGNAL_DURING_IMPORTS = """
import importlib.abc, os, signal, sys, time

class SignalOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "packtool.signals":  # the module that installs packtool's handlers
            os.kill(os.getpid(), signal.{sig})
            time.sleep(0.5)  # a Python handler runs here
        return None

sys.meta_path.insert(0, SignalOnImport())
sys.argv = ["packtool", "--version"]
from packtool.__main__ import main
main()
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_command_imports_its_handlers_exits_with_one_line(sig):
    """SIGINT (SIGTERM) while ``packtool`` imports the modules that install its handlers (tens
    of milliseconds after the interpreter starts): exit 130 (143) and the one start-up line,
    nothing written; it was a ``KeyboardInterrupt`` traceback (a silent death by SIGTERM)."""
    code = _SIGNAL_DURING_IMPORTS.format(sig=sig)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    word = "terminated (SIGTERM)" if sig == "SIGTERM" else "interrupted"
    assert p.returncode == 128 + getattr(signal, sig), (p.returncode, p.stderr)
    assert p.stderr == f"packtool: {word}; nothing was written\n", p.stderr
    assert p.stdout == ""


_HANDLER_SET_IN_C = """
import signal, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from torch.utils.data._utils.signal_handling import _set_worker_signal_handlers
from packtool.signals import hold, interruptible, result, signals_held

_set_worker_signal_handlers()  # what a DataLoader worker runs first: SIGTERM handled in C
with ThreadPoolExecutor(1) as pool:
    result(pool.submit(time.sleep, 0.2))  # a wait for a row group the read-ahead decodes
hold()()
with signals_held():
    pass
with interruptible():
    pass
print("ready", flush=True)
time.sleep(60)
"""


def test_a_handler_set_in_c_is_left_in_place():
    """A SIGTERM handler that Python did not install (a torch DataLoader worker's, which ends
    the worker with status 0 when the training process terminates it) stays after packtool's
    waits and holds. It was swapped and then restored as the default action: the training
    process's exit terminated such workers, and torch reported each one "killed by signal:
    Terminated" from an atexit callback."""
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, "-c", _HANDLER_SET_IN_C], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if line == "ready":
            proc.send_signal(signal.SIGTERM)  # from its parent: torch's handler exits 0
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert line == "ready", (line, err)
    assert proc.returncode == 0, (proc.returncode, err)
