"""One error hierarchy for everything packtool raises on purpose.

Every message says what is wrong, where (file, row group, row, field) and what to do. The CLI
turns a :class:`PacktoolError` into a one-line message and the exit status of its class
(:attr:`PacktoolError.exit_code`): one rule for every command,

- ``EXIT_DATA`` (1): the input, the output or a check failed (missing or bad file, a recount
  that disagrees with the manifest, a failed verify check, a missing optional dependency);
- ``EXIT_USAGE`` (2): the command line cannot run (unknown option, bad option value or
  combination); click's own usage errors use the same status;
- ``EXIT_INTERRUPTED`` (130 = 128 + SIGINT): stopped by Ctrl-C; 143 (128 + SIGTERM) when
  stopped by SIGTERM (a batch scheduler), the same clean stop.

Row numbers in messages are 0-based and labelled so (:func:`row_ref`).
"""

from __future__ import annotations

__all__ = [
    "EXIT_DATA",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
    "row_ref",
    "install_hint",
    "PacktoolError",
    "ConfigError",
    "InputError",
    "SchemaError",
    "PackingError",
    "OutputError",
    "ManifestError",
    "VerifyError",
    "MissingDependencyError",
    "EngineError",
    "Interrupted",
]

EXIT_DATA = 1  #: bad input/output data, a failed check, a missing dependency
EXIT_USAGE = 2  #: a command line that cannot run (as click's usage errors)
EXIT_INTERRUPTED = 130  #: 128 + SIGINT, the shell convention for Ctrl-C


def row_ref(index: int) -> str:
    """``"row 7 (0-based)"``: how messages name a row of a file, labelled so nobody guesses.

    Args:
        index: 0-based row index within the file (across row groups).
    """
    return f"row {int(index)} (0-based)"


#: where verify's torch comes from on a machine without a GPU (PyPI's Linux wheels are CUDA)
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def install_hint(extra: str) -> str:
    """The ``pip install ...`` that adds packtool's optional ``extra`` to this environment.

    packtool is not on a package index, so ``pip install 'packtool[ray]'`` would fail (or
    install someone else's package): the hint names the extra's own requirements, read from
    the installed packtool's metadata (e.g. ``pip install 'ray>=2.9'``), with PyTorch's CPU
    index for torch. Falls back to ``pip install -e '.[EXTRA]'`` (from a checkout).
    """
    import re
    from importlib import metadata

    try:
        reqs = metadata.requires("packtool") or []
    except metadata.PackageNotFoundError:
        reqs = []
    mine = [r.split(";")[0].strip() for r in reqs
            if re.search(rf"""extra\s*==\s*['"]{re.escape(extra)}['"]""", r)]
    mine = [r.replace(" ", "") for r in mine if not r.startswith("packtool")]
    if not mine:
        return f"pip install -e '.[{extra}]' in a packtool checkout"
    cmd = "pip install " + " ".join(f"'{r}'" for r in mine)
    if any(re.match(r"torch\b", r) for r in mine):
        cmd += f" --index-url {TORCH_CPU_INDEX} (the CPU build; for CUDA drop --index-url)"
    return cmd


class PacktoolError(Exception):
    """Base class of every error packtool raises on purpose."""

    exit_code: int = EXIT_DATA  #: exit status of the ``packtool`` command for this error


class ConfigError(PacktoolError):
    """An option has a value packtool cannot work with (names the option and the value).

    A usage error: exit status 2, as click's own for a malformed command line."""

    exit_code = EXIT_USAGE


class InputError(PacktoolError):
    """An input path is missing, unreadable, or not Parquet."""


class SchemaError(InputError):
    """The token column is missing, has the wrong type, or holds values outside the contract."""


class PackingError(PacktoolError):
    """The packing plan cannot be built, e.g. a document over capacity with ``--overflow error``."""


class OutputError(PacktoolError):
    """OUTPUT cannot be written (exists, is a file, lies inside INPUT, is not writable)."""


class ManifestError(PacktoolError):
    """A packed directory is incomplete or does not match its manifest (missing/edited shard)."""


class VerifyError(PacktoolError):
    """``packtool verify`` found a packed row that does not compute what separate documents do."""


class MissingDependencyError(PacktoolError):
    """An optional dependency is not installed; the message names the pip extra to install."""


class EngineError(PacktoolError):
    """A task failed in the engine for a reason other than bad input (e.g. a Ray worker lost
    after its retries); OUTPUT is left resumable."""


class Interrupted(PacktoolError):
    """The run was stopped by Ctrl-C or SIGTERM; the message says what state it left (exit
    status 130, or ``exit_code``: 143 for SIGTERM)."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str, exit_code: int = EXIT_INTERRUPTED):
        super().__init__(message)
        self.exit_code = exit_code
