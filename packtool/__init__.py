"""packtool: pack tokenized documents into fixed-capacity rows for document-masked training."""

__version__ = "0.1.0"

from packtool.core import PackedRows, PackPlan, layout_rows, pack_lengths  # noqa: E402
from packtool.stats import PackStats  # noqa: E402
from packtool.types import IGNORE_INDEX, LabelMode, Overflow, Strategy  # noqa: E402

__all__ = ["__version__", "pack_lengths", "layout_rows", "PackPlan", "PackedRows", "PackStats",
           "IGNORE_INDEX", "Strategy", "Overflow", "LabelMode"]
