"""Shared constants and choice enums.

The CLI builds its ``click.Choice`` lists from these enums, so there is one list of names.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["IGNORE_INDEX", "Strategy", "Overflow", "LabelMode", "Engine", "INT32_MAX",
           "DEFAULT_TOKEN_COLUMN", "ATTENTION_MASK_COLUMN", "LABELS_COLUMN", "LOSS_MASK_COLUMNS",
           "PACKED_COLUMNS", "COLUMN_OPTIONS", "token_column_fix"]

#: the token column pack, compare and tokenize read (and write) unless told another
DEFAULT_TOKEN_COLUMN = "input_ids"

#: The per-token columns pack reads by name under ``--attention-mask-column auto``,
#: ``--labels-column auto`` and ``--loss-mask-column auto``
#: (:func:`packtool.formats.reader.resolve_mask_columns`).
ATTENTION_MASK_COLUMN = "attention_mask"
LABELS_COLUMN = "labels"
#: Loss masks recognised under ``auto`` (TRL's SFT columns, 1 = a token to learn):
#: ``completion_mask`` (prompt-completion data) and ``assistant_masks`` (chat templates with
#: ``return_assistant_tokens_mask``).
LOSS_MASK_COLUMNS = ("completion_mask", "assistant_masks")

#: Columns the packers of the field write beside rows they packed (several documents a row):
#: TRL's ``bfd`` packing (``seq_lengths``), position ids restarting at each document (TRL,
#: axolotl, VeOmni), flash-attn varlen / Hugging Face offsets (``cu_seqlens``,
#: ``cu_seq_lens``), segment ids, Mamba's ``seq_idx``, NeMo's packed ``seq_start_id``. An input
#: file holding one is refused from its schema alone (its values are never read): it marks rows
#: another tool packed, whose documents reading each row as one document would join. A file
#: whose rows are each one document and carry such a column is packed once the column is
#: dropped; the refusal says so, never that the rows were found to hold several documents.
PACKED_COLUMNS = ("seq_lengths", "position_ids", "cu_seqlens", "cu_seq_lens", "segment_ids",
                  "seq_idx", "seq_start_id")

#: The options naming an input column read beside the tokens: what that column holds, and how
#: to pack without it (the fix of a message refusing the option's value)
COLUMN_OPTIONS = {
    "--source-column": ("each document's source (a string or integer per document)",
                        "drop --source-column"),
    "--attention-mask-column": ("the attention mask (0 or 1 per token)",
                                "pass --attention-mask-column none"),
    "--labels-column": ("the labels (-100 or the token itself, per token)",
                        "pass --labels-column none"),
    "--loss-mask-column": ("the loss mask (1 on the tokens to learn, 0 elsewhere)",
                           "pass --loss-mask-column none"),
}


def token_column_fix(option: str, column: str) -> str:
    """The fix of a message refusing ``option`` (a key of :data:`COLUMN_OPTIONS`) naming the
    token column ``column``: name another column, the one holding what the option reads, or
    pack without it; or give the real token column with ``--column``."""
    holds, without = COLUMN_OPTIONS[option]
    return (f"name another column, the one holding {holds}, or {without}; if {column} is not "
            "the token column, give the token column with --column NAME")


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
