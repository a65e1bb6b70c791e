"""Ctrl-C (SIGINT) and SIGTERM for ``packtool``: exit status 130 / 143 (128 + the signal) at any
moment, never a library traceback.

SIGTERM is what batch schedulers (Slurm, Kubernetes, ``timeout``) send before they kill a job;
it is handled exactly as Ctrl-C, only the exit status (143) and the first word of the message
("terminated") differ.

The handlers, swapped by the pack driver:

- before OUTPUT is touched (start-up, imports, argument parsing, reading footers) there is
  nothing to clean up, so :func:`install_early_handler` (called by the ``packtool`` command
  alone) makes SIGINT and SIGTERM print one line and end the process at once: "nothing was
  written", or what OUTPUT keeps of an earlier stopped run for its rerun, once the command
  has said so (:func:`early_words`);
- while a pack owns OUTPUT, :func:`interruptible` makes SIGINT and SIGTERM set :data:`STOP` and
  raise ``KeyboardInterrupt`` in the main thread, so the run leaves through its one cleanup path
  (:mod:`packtool.output`). Worker threads call :func:`check` between record batches and row
  groups; a library that swallows the ``KeyboardInterrupt`` cannot make the run go on, because
  :data:`STOP` stays set and the next check raises again. :func:`stop_signal` tells which
  signal stopped the run. Used as a library (no early handler), a SIGTERM that stopped the run
  is delivered again to the handler that was there before (by default: the process ends, as it
  would have without packtool) once OUTPUT is clean and unlocked. After the block (the command
  printing its summary), one signal is let pass when the run had finished: the command exits 0
  (a second one ends it at once, saying that the output is complete); when the run was already
  stopping, a signal ends the command at once. Never with "nothing was written".

A handler that C code installed (a torch DataLoader worker's SIGTERM handler, which ends the
worker quietly when the training process terminates it) is never swapped: Python could not put
it back, and the default action it would set instead makes the worker die by the signal.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import Future, wait
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["EXIT_INTERRUPTED", "STOP", "STOP_SIGNALS", "install_early_handler", "interruptible",
           "check", "hold", "signals_held", "stop_now", "stop_signal", "exit_status", "stop_word",
           "result", "test_pause", "PAUSE_ENV", "PAUSE_ONCE_ENV", "TEST_ENVS", "early_words"]

#: Exit status of an interrupted command (128 + SIGINT, what shells report for Ctrl-C).
EXIT_INTERRUPTED = 130

#: The signals that stop a run cleanly: Ctrl-C and a scheduler's SIGTERM.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: Set by SIGINT or SIGTERM (or by a failed task) while a pack runs: every worker stops at its
#: next check.
STOP = threading.Event()

_stopped_by: list[int] = []  # the signal that set STOP in the current run (at most one kept)
_command = False  # install_early_handler() ran: packtool runs as the command, not a library


def stop_signal() -> int:
    """The signal that stopped the current (or last) run: SIGTERM, or SIGINT (also when none
    was recorded: a ``KeyboardInterrupt`` raised by Python itself)."""
    return _stopped_by[0] if _stopped_by else int(signal.SIGINT)


def exit_status() -> int:
    """Exit status for a run stopped by :func:`stop_signal`: 128 + its number (130, 143)."""
    return 128 + stop_signal()


def stop_word() -> str:
    """How a message names the stop: ``interrupted`` (Ctrl-C) or ``terminated (SIGTERM)``."""
    return "terminated (SIGTERM)" if stop_signal() == signal.SIGTERM else "interrupted"


#: What :func:`_early` says instead of "nothing was written" (set by :func:`early_words`)
_early_said: list[bytes] = []


def early_words(words: str | None) -> None:
    """What a Ctrl-C or SIGTERM before the command's run has entered its output says, instead
    of ``nothing was written``: ``packtool: interrupted: WORDS`` (the command, once it knows
    what its output holds: the work a stopped run kept there for its rerun). None: the plain
    line again."""
    _early_said[:] = [words.encode("utf-8", "replace")] if words else []


def _early(signum, frame) -> None:  # pragma: no cover - runs in a subprocess
    word = b"terminated (SIGTERM)" if signum == signal.SIGTERM else b"interrupted"
    said = b": " + _early_said[0] if _early_said else b"; nothing was written"
    os.write(2, b"packtool: " + word + said + b"\n")
    os._exit(128 + signum)


_late: list[int] = []  # a signal that came after the run finished (the command still ends 0)


def _finished(signum, frame) -> None:  # pragma: no cover - runs in a subprocess
    if not _late:  # the run is over and its output complete: the summary is printed, exit 0
        _late.append(signum)
        return
    word = b"terminated (SIGTERM)" if signum == signal.SIGTERM else b"interrupted"
    os.write(2, b"packtool: " + word + b" after the run finished; its output is complete\n")
    os._exit(128 + signum)


def _stopping(signum, frame) -> None:  # pragma: no cover - runs in a subprocess
    word = b"terminated (SIGTERM)" if signum == signal.SIGTERM else b"interrupted"
    os.write(2, b"packtool: " + word + b" again while stopping; rerun the same command\n")
    os._exit(128 + signum)


def install_early_handler() -> None:
    """SIGINT and SIGTERM end the process at once with status 128 + the signal (only before
    OUTPUT is touched). Called by the ``packtool`` command only: a library caller keeps its
    own handlers.

    The signals are also unblocked, in case the parent started us with them blocked: one that
    was held pending (sent before this handler existed) is delivered here, to this handler.
    """
    global _command
    if threading.current_thread() is threading.main_thread():
        _command = True
        for sig in STOP_SIGNALS:
            signal.signal(sig, _early)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))


def _raise(signum, frame) -> None:
    if not _stopped_by:
        _stopped_by.append(signum)
    STOP.set()
    raise KeyboardInterrupt


def stop_now(signum: int) -> None:
    """Stop the run as signal ``signum`` (SIGINT or SIGTERM) would have inside
    :func:`interruptible`: for a signal that :func:`hold` noted while work was held and that
    still matters once it is done (:func:`stop_signal` then names it).

    Raises:
        KeyboardInterrupt: always.
    """
    _raise(signum, None)


@contextmanager
def interruptible() -> Iterator[None]:
    """While inside: SIGINT and SIGTERM set :data:`STOP` and raise ``KeyboardInterrupt`` (main
    thread).

    :data:`STOP` and :func:`stop_signal` are cleared on entry; the previous handlers are
    restored on exit. Outside the main thread (where signal handlers cannot be set) only
    :data:`STOP` is managed. Used as a library (not the ``packtool`` command), a SIGTERM that
    stopped the run is raised again on exit, after the cleanup inside the block, for the handler
    that was there before (the default one ends the process, as without packtool). A handler
    installed in C is left in place (:func:`_swappable`): that signal does what it did.
    """
    STOP.clear()
    _stopped_by.clear()
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _raise) for sig in _swappable()} if main else {}
    finished = False
    try:
        yield
        finished = True
    finally:
        for sig, handler in previous.items():
            if handler in (_early, _finished, _stopping):  # the command's own: no longer
                handler = _finished if finished else _stopping  # "nothing was written"
            signal.signal(sig, handler)
        if (main and not _command and _stopped_by == [signal.SIGTERM]
                and previous.get(signal.SIGTERM) is not _raise):
            signal.raise_signal(signal.SIGTERM)


def hold() -> Callable[[], "int | None"]:
    """From now on SIGINT and SIGTERM only set a flag (main thread; elsewhere nothing changes):
    for work that must not be cut short, such as tidying OUTPUT once its manifest is written.

    Returns:
        ``release()``: restores the previous handlers and returns the first signal that came
        meanwhile (SIGINT or SIGTERM), None when none did (the caller decides whether it still
        matters: :func:`stop_now`). Call it once.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    noted, restore = _note_signals()

    def release() -> int | None:
        restore()
        return noted[0] if noted else None

    return release


def _set_outside_python(sig: int) -> bool:
    """Whether the handler of ``sig`` was installed outside Python, by C code: a torch
    DataLoader worker's SIGTERM handler (it ends the worker with status 0 when the training
    process terminates it). Python cannot put such a handler back once it swapped it: its own
    record says None, or the default action or ignore it saw at start-up (or in the process it
    was forked from), so "restoring" it sets that action. Seen as: Python's record is None, or
    (Linux) Python's record is the default action or ignore while the kernel says the signal
    is caught (``SigCgt`` of ``/proc/self/status``)."""
    known = signal.getsignal(sig)
    if known is None:
        return True
    if known not in (signal.SIG_DFL, signal.SIG_IGN):
        return False
    key = (os.getpid(), sig, known)  # a process sets its C handlers as it starts: asked once
    if key not in _CAUGHT:
        _CAUGHT[key] = _caught_by_kernel(sig)
    return _CAUGHT[key]


#: (process id, signal, Python's record) -> whether the kernel says the signal is caught, read
#: once per process (:func:`_set_outside_python`: reading it costs about 35 us, and a loader
#: waiting for the row groups it reads ahead asks at every wait)
_CAUGHT: dict = {}


def _caught_by_kernel(sig: int) -> bool:
    """Whether ``SigCgt`` of ``/proc/self/status`` says ``sig`` is caught (Linux; False where
    it cannot be read)."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _swappable() -> list[int]:
    """The :data:`STOP_SIGNALS` whose handlers packtool may swap and put back: not one
    installed in C (:func:`_set_outside_python`), which is left to do what it does."""
    return [sig for sig in STOP_SIGNALS if not _set_outside_python(sig)]


def _note_signals() -> tuple[list[int], Callable[[], None]]:
    """Swap the SIGINT and SIGTERM handlers (main thread) for ones that only note the signal:
    returns the list they note into and ``restore()``, which puts the previous handlers back.
    A handler installed in C is left in place (:func:`_swappable`)."""
    noted: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: noted.append(signum))
                for sig in _swappable()}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return noted, restore


@contextmanager
def _noted() -> Iterator[list[int]]:
    """Inside (main thread): SIGINT and SIGTERM are only noted in the list yielded; on exit the
    previous handlers come back and each noted signal is raised again for them, from this one
    clean point (not from inside a lock that a raising handler could leave held)."""
    noted, restore = _note_signals()
    try:
        yield noted
    finally:
        restore()
        for sig in dict.fromkeys(noted):
            signal.raise_signal(sig)


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM (main thread only) until the block ends, then deliver them: for a
    store write that a stream closed by an exception would publish half-written.

    The handlers are swapped for ones that only note the signal, and a noted signal is raised
    again once the previous handlers are back. A signal mask would not do: the kernel hands a
    signal the main thread blocks to any other thread (a worker pool, pyarrow's I/O threads),
    and Python then runs its handler in the main thread all the same.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _noted():
        yield


#: Seconds between looks at pending signals while the main thread waits for another thread.
POLL_S = 0.1


def result(future: Future):
    """``future.result()``, for the main thread: Ctrl-C and SIGTERM are handled within
    :data:`POLL_S` seconds, and never inside the future's lock.

    Two faults of a plain wait, both seen as a pack that hung after a signal:

    - the kernel hands a signal sent to the process to any thread that does not block it (a
      worker, pyarrow's or tqdm's threads). That thread only notes it; Python runs the handler
      in the main thread when it next executes bytecode, which a wait without a timeout never
      does, so the run went on until the task ended (never, for one that waits for
      :data:`STOP`);
    - a handler that raises (``KeyboardInterrupt``) can do so between a lock's acquire and
      the block that releases it, inside the futures' own code; the task then cannot report
      its end, and the pool's shutdown waits for it forever.

    So the wait polls with signals only noted, and a noted signal goes to the previous
    handler once the wait is left. Outside the main thread (where no handler runs) it is a
    plain wait.

    Returns:
        what the task returned.

    Raises:
        whatever the task raised (a ``TimeoutError`` of the task's own included), or what the
        handler of a signal that came meanwhile raises (``KeyboardInterrupt``).
    """
    if not future.done() and threading.current_thread() is threading.main_thread():
        with _noted() as noted:
            while not noted and not wait([future], timeout=POLL_S).done:
                pass
    return future.result()


def check() -> None:
    """Raise ``KeyboardInterrupt`` when the run was told to stop (call between units of work)."""
    if STOP.is_set():
        raise KeyboardInterrupt


#: Test hook (used only by the crash, interrupt and cluster tests):
#: ``PACKTOOL_TEST_PAUSE_AT=<phase>[:<n>]`` with phase ``start`` (the ``pack`` or
#: ``tokenize`` command knows its outputs, has not touched them: the start-up handler is in
#: place), ``read`` (n = read part),
#: ``read-piece`` (n = piece of its read part, before it is read), ``plan`` (n = window),
#: ``write-shard`` (n = shard), ``manifest`` or ``holdout`` (``--holdout``: the training output
#: finished, the held-out pack not begun) makes ``pack`` print a line to stderr and wait
#: there until it is killed or told to stop; ``tokenize-shard`` (n = shard of this run, before
#: it is written) and ``export-block`` (n = block of rows read, its temporary file open) do the
#: same in ``tokenize`` and ``export``, and ``upgrade`` (OUTPUT's lock taken, nothing checked
#: or written yet) in ``upgrade``. Unset, it costs one lookup.
PAUSE_ENV = "PACKTOOL_TEST_PAUSE_AT"

#: With :data:`PAUSE_ENV`: ``PACKTOOL_TEST_PAUSE_ONCE=<file>`` pauses only the first process
#: that creates ``<file>`` (it writes its pid there), so a retried task runs through, and a
#: test knows which process (a Ray worker, on any node) to kill.
PAUSE_ONCE_ENV = "PACKTOOL_TEST_PAUSE_ONCE"

#: The test hooks' variables, which the Ray engine hands on to its tasks when they are set.
TEST_ENVS = (PAUSE_ENV, PAUSE_ONCE_ENV)


def test_pause(phase: str, n: int = 0) -> None:
    """Wait at ``phase`` when :data:`PAUSE_ENV` asks for it (see there and
    :data:`PAUSE_ONCE_ENV`)."""
    want = os.environ.get(PAUSE_ENV)
    if want and want.partition(":")[0] == phase and int(want.partition(":")[2] or 0) == n:
        import sys
        import time

        once = os.environ.get(PAUSE_ONCE_ENV)
        if once:
            try:
                fd = os.open(once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return  # another attempt paused already: this one runs through
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
        print(f"packtool: test pause at {want}", file=sys.stderr, flush=True)
        while True:
            check()
            time.sleep(0.05)
