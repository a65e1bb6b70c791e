"""One error hierarchy for everything packtool raises on purpose.

Every message says what is wrong, where (file, row group, row, field) and what to do. The CLI
turns a :class:`PacktoolError` into a one-line message and exit status 1.
"""

from __future__ import annotations

__all__ = [
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
]


class PacktoolError(Exception):
    """Base class of every error packtool raises on purpose."""


class ConfigError(PacktoolError):
    """An option has a value packtool cannot work with (names the option and the value)."""


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
