"""Shared constants and choice enums.

The CLI builds its ``click.Choice`` lists from these enums, so there is one list of names.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["IGNORE_INDEX", "Strategy", "Overflow", "LabelMode", "Engine", "INT32_MAX",
           "DEFAULT_TOKEN_COLUMN"]

#: the token column pack, compare and tokenize read (and write) unless told another
DEFAULT_TOKEN_COLUMN = "input_ids"

#: Label value that loss functions skip (PyTorch ``cross_entropy(ignore_index=-100)``).
IGNORE_INDEX = -100

#: Largest token id the packed ``input_ids`` column (int32) can hold.
INT32_MAX = 2**31 - 1


class _StrEnum(str, Enum):
    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


class Strategy(_StrEnum):
    """How documents are assigned to rows."""

    OBFD = "obfd"  #: best-fit-decreasing over a capacity tree (arXiv 2404.10830)
    ORDERED = "ordered"  #: order-preserving next-fit
    CONCAT = "concat"  #: one continuous stream cut every C tokens


class Overflow(_StrEnum):
    """What happens to a document longer than the capacity."""

    SPLIT = "split"  #: consecutive chunks of C tokens, each its own segment
    TRUNCATE = "truncate"  #: keep the first C tokens
    DROP = "drop"  #: leave the document out
    ERROR = "error"  #: refuse the input


class LabelMode(_StrEnum):
    """Which ``labels`` column is written."""

    UNSHIFTED = "unshifted"  #: Hugging Face convention: the model shifts
    SHIFTED = "shifted"  #: labels[i] = input_ids[i + 1] within a segment
    NONE = "none"  #: no labels column


class Engine(_StrEnum):
    """Where ``packtool pack`` runs (the output bytes do not depend on it)."""

    LOCAL = "local"  #: this process, threads for layout and encoding
    RAY = "ray"  #: one Ray task per window, on a local Ray instance or a cluster
