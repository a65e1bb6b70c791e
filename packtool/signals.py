"""Ctrl-C (SIGINT) for ``packtool``: exit status 130 at any moment, never a library traceback.

Two handlers, swapped by the pack driver:

- before OUTPUT is touched (start-up, imports, argument parsing, reading footers) there is
  nothing to clean up, so :func:`install_early_handler` makes SIGINT print one line and end the
  process with status 130 at once;
- while a pack owns OUTPUT, :func:`interruptible` makes SIGINT set :data:`STOP` and raise
  ``KeyboardInterrupt`` in the main thread, so the run leaves through its one cleanup path
  (:mod:`packtool.output`). Worker threads call :func:`check` between record batches and row
  groups; a library that swallows the ``KeyboardInterrupt`` cannot make the run go on, because
  :data:`STOP` stays set and the next check raises again.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["EXIT_INTERRUPTED", "STOP", "install_early_handler", "interruptible", "check", "hold",
           "signals_held",
           "test_pause", "PAUSE_ENV", "PAUSE_ONCE_ENV", "TEST_ENVS"]

#: Exit status of an interrupted command (128 + SIGINT, what shells report for Ctrl-C).
EXIT_INTERRUPTED = 130

#: Set by SIGINT (or by a failed task) while a pack runs: every worker stops at its next check.
STOP = threading.Event()


def _early(signum, frame) -> None:  # pragma: no cover - runs in a subprocess
    os.write(2, b"packtool: interrupted; nothing was written\n")
    os._exit(EXIT_INTERRUPTED)


def install_early_handler() -> None:
    """SIGINT ends the process at once with status 130 (only before OUTPUT is touched).

    SIGINT is also unblocked, in case the parent started us with it blocked: a SIGINT that was
    held pending (sent before this handler existed) is delivered here, to this handler.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _early)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _raise(signum, frame) -> None:
    STOP.set()
    raise KeyboardInterrupt


@contextmanager
def interruptible() -> Iterator[None]:
    """While inside: SIGINT sets :data:`STOP` and raises ``KeyboardInterrupt`` (main thread).

    :data:`STOP` is cleared on entry; the previous handler is restored on exit. Outside the
    main thread (where signal handlers cannot be set) only :data:`STOP` is managed.
    """
    STOP.clear()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    if main:
        signal.signal(signal.SIGINT, _raise)
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


def hold() -> Callable[[], bool]:
    """From now on SIGINT only sets a flag (main thread; elsewhere nothing changes): for work
    that must not be cut short, such as tidying OUTPUT once its manifest is written.

    Returns:
        ``release()``: restores the previous handler and returns whether a SIGINT came
        meanwhile (the caller decides whether that still matters). Call it once.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: False
    noted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))

    def release() -> bool:
        signal.signal(signal.SIGINT, previous)
        return bool(noted)

    return release


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
    noted: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: noted.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set in C
        for sig in dict.fromkeys(noted):
            signal.raise_signal(sig)


def check() -> None:
    """Raise ``KeyboardInterrupt`` when the run was told to stop (call between units of work)."""
    if STOP.is_set():
        raise KeyboardInterrupt


#: Test hook (used only by the crash, interrupt and cluster tests):
#: ``PACKTOOL_TEST_PAUSE_AT=<phase>[:<n>]`` with phase ``read`` (n = read part),
#: ``read-piece`` (n = piece of its read part, before it is read), ``plan`` (n = window),
#: ``write-shard`` (n = shard) or ``manifest`` makes ``pack`` print a line to stderr and wait
#: there until it is killed or told to stop. Unset, it costs one lookup.
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
