"""The pure numeric core: numpy arrays in, numpy arrays out. No paths, no pyarrow, no printing."""

from packtool.core.layout import PackedRows, layout_rows
from packtool.core.packing import MAX_CAPACITY, PackPlan, pack_lengths

__all__ = ["PackPlan", "PackedRows", "pack_lengths", "layout_rows", "MAX_CAPACITY"]
