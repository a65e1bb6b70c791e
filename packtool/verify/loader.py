"""Deprecated location of the torch data path: use :mod:`packtool.loader`.

``PackedDataset``, ``collate`` and ``unshifted_labels`` are re-exported from
:mod:`packtool.loader` (importing this module warns with ``DeprecationWarning``).
``PackedDataset`` here keeps the old ``reader`` attribute (the dataset's
:class:`~packtool.formats.packed.PackedOutput`) and reports ``labels_mode == "none"`` for outputs
that store no labels read with the unshifted labels derived from them, as before (labels asked
``shifted`` say ``shifted``).
"""

from __future__ import annotations

import warnings

from packtool.loader import PackedDataset as _PackedDataset
from packtool.loader import collate, unshifted_labels  # noqa: F401

__all__ = ["PackedDataset", "collate", "unshifted_labels"]

warnings.warn("packtool.verify.loader is deprecated; import PackedDataset, collate and "
              "unshifted_labels from packtool.loader", DeprecationWarning, stacklevel=2)


class PackedDataset(_PackedDataset):
    """:class:`packtool.loader.PackedDataset` with the old ``reader`` attribute and
    ``labels_mode`` (``none`` when the shards store no labels and the items carry the unshifted
    labels derived from the segments; the convention itself otherwise)."""

    def __init__(self, path, **kwargs) -> None:
        super().__init__(path, **kwargs)
        # "none" meant the labels derived by the unshifted rule; derived shifted labels say so
        derived = not self.output.labels.stored and self.labels_mode == "unshifted"
        self._shown_mode = "none" if derived else self.labels_mode

    @property
    def reader(self):
        """The :class:`~packtool.formats.packed.PackedOutput` this dataset reads."""
        return self.output

    def __getitem__(self, index: int) -> dict:
        item = super().__getitem__(index)
        item["labels_mode"] = self._shown_mode
        return item
