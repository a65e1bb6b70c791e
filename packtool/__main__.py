"""``python -m packtool`` and the ``packtool`` console script."""


def main() -> None:
    """Entry point: Ctrl-C from the first instant exits 130 with one line, then the CLI runs."""
    from packtool.signals import install_early_handler

    install_early_handler()
    from packtool.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
