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

A machine that runs short (memory, open files) is never reported as bad data: every layer that
turns a pyarrow or OS error into "cannot be read" / "damaged" first lets a shortage through
(:func:`raise_if_shortage`), and the layer that knows the phase words it once
(:func:`shortage_error`, a :class:`ResourceError` naming the fix).
"""

from __future__ import annotations

import errno
import re

__all__ = [
    "PackWarning",
    "EXIT_DATA",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
    "row_ref",
    "first_line",
    "exc_line",
    "install_hint",
    "PacktoolError",
    "ConfigError",
    "InputError",
    "SchemaError",
    "PackingError",
    "OutputError",
    "LocationError",
    "ManifestError",
    "VerifyError",
    "LoaderError",
    "MissingDependencyError",
    "EngineError",
    "ResourceError",
    "OutOfMemoryError",
    "Interrupted",
    "shortage",
    "raise_if_shortage",
    "shortage_error",
    "is_full_disk",
    "inodes_exhausted",
    "inodes_note",
    "as_read",
    "is_read",
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


#: pyarrow's refusal of a Python value, quoting the value's printed form (which spans lines
#: for a DataFrame or a 2-D array): ``Could not convert <repr> with type T: reason``.
_ARROW_CONVERT = re.compile(r"\s*Could not convert (.*?) with type ([\w.]+)(:[^\n]*)?", re.S)


def first_line(exc: BaseException, default: str | None = None) -> str:
    """The first non-empty line of ``exc``'s message, stripped (library errors run over several
    lines, some begin with a newline), for a one-line message; ``default`` (else the
    exception's class name) when the message is empty. pyarrow's ``Could not convert <value>
    with type T: reason`` whose value's printed form spans lines or runs long is told as
    ``Could not convert a value of type T: reason``."""
    m = _ARROW_CONVERT.match(str(exc))
    if m and ("\n" in m.group(1) or len(m.group(1)) > 60):
        return f"Could not convert a value of type {m.group(2)}{m.group(3) or ''}"
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__ if default is None else default


def exc_line(exc: BaseException) -> str:
    """``"ValueError: <first line>"``: the exception's class and :func:`first_line` (the class
    alone when the message is empty)."""
    text = first_line(exc, "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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


class PackWarning(UserWarning):
    """A pack's loud note for Python callers (``packtool.pack``, ``packtool.pack_dataset``):
    many tokens dropped or cut (``overflow``, ``min_fill``), no effective targets; the command
    line prints the same notes as ``WARNING:`` lines."""


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


class LocationError(InputError, OutputError):
    """A name that is no location: an empty path, a ``file:`` URI that names another machine
    or no absolute path (:meth:`packtool.location.Location.parse`), refused before anything is
    read or written. An :class:`InputError` where it is given as INPUT, an
    :class:`OutputError` where as OUTPUT: exit status 1, as a location that cannot be opened."""


class ManifestError(PacktoolError):
    """A packed directory is incomplete or does not match its manifest (missing/edited shard)."""


class VerifyError(PacktoolError):
    """``packtool verify`` found a packed row that does not compute what separate documents do,
    or :func:`packtool.loader.check_isolation` a model that, fed its collator's batch, does not
    keep packed documents apart."""


class LoaderError(PacktoolError):
    """The training loader's set-up cannot keep its promise (every row of an epoch once over
    all ranks and workers), e.g. ranks of one job that disagree on the seed, the epoch or the
    sources (:mod:`packtool.loader.ranks`); the message names which rank has which value and
    the fix."""


class MissingDependencyError(PacktoolError):
    """An optional dependency is not installed; the message names the pip extra to install."""


class EngineError(PacktoolError):
    """A task failed in the engine for a reason other than bad input (e.g. a Ray worker lost
    after its retries); OUTPUT is left resumable."""


class ResourceError(PacktoolError):
    """The machine ran short of what the run needs (open files), not the data's fault; the
    message names the fix and what OUTPUT holds (as every failure: as before, or resumable)."""


class OutOfMemoryError(ResourceError):
    """The process ran out of memory (``MemoryError``, pyarrow's ``ArrowMemoryError``,
    ``ENOMEM``); the message names the fixes of the phase that ran out."""


_ERRNO_IN_TEXT = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)


def _errno_of(exc: BaseException) -> int | None:
    """The OS error number of ``exc``: its ``errno``, or the ``[errno N]`` pyarrow writes into
    the text of errors it raises from a failed system call."""
    code = getattr(exc, "errno", None)
    if isinstance(code, int):
        return code
    found = _ERRNO_IN_TEXT.search(str(exc))
    return int(found.group(1)) if found else None


#: What the system says, in an error without an errno, when it could not map memory: a
#: shared library loaded under a memory limit (``failed to map segment``), a thread's stack.
_NO_MEMORY_TEXT = re.compile(r"cannot allocate memory|failed to map segment|"
                             r"can't start new thread", re.IGNORECASE)


def shortage(exc: BaseException) -> str | None:
    """What the machine ran short of when ``exc`` was raised: ``"memory"`` (``MemoryError`` and
    its subclasses, pyarrow's ``ArrowMemoryError`` and NumPy's ``_ArrayMemoryError`` among them;
    ``ENOMEM``; a thread that cannot start or a shared library that cannot be mapped, as under
    ``ulimit -v``), ``"files"`` (``EMFILE``/``ENFILE``: too many open files), else None."""
    if isinstance(exc, MemoryError):
        return "memory"
    if not isinstance(exc, Exception) or isinstance(exc, PacktoolError):
        return None
    code = _errno_of(exc)
    if code == errno.ENOMEM:
        return "memory"
    if (code is None or code == errno.EAGAIN) and isinstance(exc, (RuntimeError, OSError)) \
            and _NO_MEMORY_TEXT.search(str(exc)):
        return "memory"
    if code in (errno.EMFILE, errno.ENFILE):
        return "files"
    return None


def raise_if_shortage(exc: BaseException, where: str | None = None) -> None:
    """Re-raise ``exc`` unchanged when it is a shortage (:func:`shortage`), so that no handler
    turns it into "the file is damaged"; call first in every ``except`` that would.

    Args:
        exc: the exception being handled.
        where: what was being done, for the final message (``in/a.parquet: row group 0``);
            kept as a note on ``exc``.
    """
    if shortage(exc) is None:
        return
    if where and not getattr(exc, "__notes__", None):
        exc.add_note(str(where))
    raise exc


def _open_files_limit() -> str:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return ""
    return "" if soft == getattr(resource, "RLIM_INFINITY", -1) else f" (the limit is {soft})"


def shortage_error(exc: BaseException, *, memory: str = "", files: str = "", state: str = "",
                   where: str | None = None) -> ResourceError | None:
    """The one-line :class:`ResourceError` for a shortage (:func:`shortage`), None for any
    other exception.

    Args:
        exc: the exception.
        memory: what lowers the memory of the phase that ran out, after "run with more
            memory" (``or fewer --workers``).
        files: what needs fewer open files, after raising the limit (``use fewer --workers``).
        state: what OUTPUT holds now (``OUTPUT is as it was before the run``).
        where: what was being done, when ``exc`` carries no note of it (a path).
    """
    kind = shortage(exc)
    if kind is None:
        return None
    notes = getattr(exc, "__notes__", None)
    where = notes[0] if notes else where or getattr(exc, "filename", None)
    prefix = f"{where}: " if where else ""
    tail = f"; {state}" if state else ""
    if kind == "memory":
        cause = getattr(exc, "strerror", None) or first_line(exc, "no memory left")
        more = f", {memory}" if memory else ""
        return OutOfMemoryError(f"{prefix}out of memory ({cause}); the data is not at fault: run "
                                f"with more memory{more}{tail}")
    more = f" or {files}" if files else ""
    return ResourceError(f"{prefix}too many open files{_open_files_limit()}; the data is not "
                         f"at fault: raise the limit (ulimit -n 65536){more}{tail}")


def is_full_disk(exc: BaseException) -> bool:
    """Whether ``exc`` is a full disk or quota: ``ENOSPC`` or ``EDQUOT`` (or their text in an
    error without an errno, as pyarrow raises some). A full disk is no shortage of the
    machine's memory or files (:func:`shortage`): the layer that writes words it, with the
    bytes it needs, or with :func:`inodes_exhausted` when files, not bytes, ran out."""
    code = _errno_of(exc)
    return code in (errno.ENOSPC, errno.EDQUOT) or (
        code is None and "No space left" in str(exc))


def inodes_exhausted(path, *, bytes_suffice: bool = False) -> bool:
    """Whether a full disk (:func:`is_full_disk`) at local ``path`` (a file or folder, or the
    nearest existing folder above it) is the filesystem out of inodes (files), not bytes: it
    has no inode free (``os.statvfs``'s ``f_favail`` is 0 on a filesystem that counts them),
    or ``bytes_suffice`` (the caller found as many bytes free as the write needs: the disk
    said full all the same). False when it cannot be told (no ``statvfs``, a store)."""
    import os

    probe = os.fspath(path)
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe.rstrip("/")) or "/"
        if parent == probe:
            break
        probe = parent
    try:
        st = os.statvfs(probe)
    except (AttributeError, OSError, ValueError):
        return bytes_suffice
    if st.f_files > 0 and st.f_favail == 0:
        return True
    return bytes_suffice


def inodes_note(path, free: int) -> str:
    """The words of a full disk that is out of inodes (:func:`inodes_exhausted`), ``free``
    bytes free: what ran out and how to see it; the caller adds the fix and what is kept."""
    return (f"no space left on device: the filesystem has run out of inodes (files), not bytes "
            f"({free:,} bytes free, no new file can be made; see df -i {path})")


def as_read(exc: OSError) -> OSError:
    """Mark ``exc`` as raised while reading a file the run wrote itself (a scratch file gone,
    or truncated: a short read), so that the layer that words it says "cannot read", not
    "cannot write"; returns ``exc``."""
    exc.packtool_read = True
    return exc


def is_read(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while reading (:func:`as_read`, or a ``short read`` told in
    its text, as a mark lost on the way back from a worker process)."""
    return bool(getattr(exc, "packtool_read", False)) or "short read" in str(exc)


class Interrupted(PacktoolError):
    """The run was stopped by Ctrl-C or SIGTERM; the message says what state it left (exit
    status 130, or ``exit_code``: 143 for SIGTERM)."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str, exit_code: int = EXIT_INTERRUPTED):
        super().__init__(message)
        self.exit_code = exit_code
