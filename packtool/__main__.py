"""``python -m packtool`` and the ``packtool`` console script."""


def main() -> None:
    """Entry point: Ctrl-C (SIGTERM) from the first instant exits 130 (143) with one line, then
    the CLI runs.

    Once the command has ended (its output written, its exit status decided), SIGINT and
    SIGTERM are ignored in every thread: one during the interpreter's teardown, which takes a
    fraction of a second after a pack, would otherwise end a finished command with status
    130/143 and no message (Python restores the default action of the signals it handled as it
    exits) or with the start-up handler's "nothing was written".
    """
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
