"""``python -m packtool`` and the ``packtool`` console script."""

import os

import _signal  # built in and loaded by the interpreter itself: importing it costs nothing


def _before_imports(signum, frame) -> None:  # pragma: no cover - runs in a subprocess
    """SIGINT or SIGTERM while ``main`` imports what installs packtool's own handlers: nothing
    was written yet (the same line and status as :func:`packtool.signals.install_early_handler`'s
    handler, which replaces this one)."""
    word = b"terminated (SIGTERM)" if signum == _signal.SIGTERM else b"interrupted"
    os.write(2, b"packtool: " + word + b"; nothing was written\n")
    os._exit(128 + signum)


def main() -> None:
    """Entry point: Ctrl-C (SIGTERM) from the first instant exits 130 (143) with one line, then
    the CLI runs.

    The first statement sets a handler through the built-in ``_signal`` module, already loaded
    by the interpreter, so that a signal while the handlers' own modules are imported (tens of
    milliseconds: ``signal`` and its ``enum``, ``concurrent.futures``, ``pathlib``) ends the
    command with that line too, not with a ``KeyboardInterrupt`` traceback (or a silent death
    by SIGTERM). Only the interpreter's own start-up and the import of the ``packtool`` package
    itself come before it.

    Once the command has ended (its output written, its exit status decided), SIGINT and
    SIGTERM are ignored in every thread: one during the interpreter's teardown, which takes a
    fraction of a second after a pack, would otherwise end a finished command with status
    130/143 and no message (Python restores the default action of the signals it handled as it
    exits) or with the start-up handler's "nothing was written".
    """
    for sig in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(sig, _before_imports)
    import signal

    from packtool.signals import STOP_SIGNALS, install_early_handler
    from packtool.startup import hold_gc, release_gc

    hold_gc()  # until the command's imports are done (packtool/startup.py)
    install_early_handler()
    from packtool.cli import main as cli_main

    try:
        cli_main()
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        release_gc(freeze=False)  # a command that ended before its imports were done


if __name__ == "__main__":
    main()
