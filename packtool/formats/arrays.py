"""Arrow arrays as NumPy, without pyarrow's conversion or compute calls: integer arrays as
views of their buffers (:func:`numpy_values`), list arrays of any layout as row lengths and
values (:func:`list_parts`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["list_parts", "numpy_values"]

#: Arrow integer types -> NumPy dtypes (looked up, not parsed, on every call).
_DTYPES = {pa.int8(): np.dtype(np.int8), pa.int16(): np.dtype(np.int16),
           pa.int32(): np.dtype(np.int32), pa.int64(): np.dtype(np.int64),
           pa.uint8(): np.dtype(np.uint8), pa.uint16(): np.dtype(np.uint16),
           pa.uint32(): np.dtype(np.uint32), pa.uint64(): np.dtype(np.uint64)}


def numpy_values(arr: pa.Array) -> np.ndarray:
    """``arr`` as NumPy: a read-only zero-copy view of its data buffer when it is an integer
    array without nulls, else ``to_numpy(zero_copy_only=False)`` (a boolean array: a copy).

    The view skips pyarrow's conversion call, which costs microseconds per column and, where
    pandas is installed, imports it on first use (a tenth of a CPU-second or more of a command's
    start or a DataLoader worker's).

    Args:
        arr: a pyarrow Array (slices allowed).

    Returns:
        A 1-D NumPy array of ``len(arr)`` values.
    """
    dtype = _DTYPES.get(arr.type)
    if dtype is not None and not arr.null_count:
        buf = arr.buffers()[1]
        if buf is None:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(buf, dtype=dtype)[arr.offset:arr.offset + len(arr)]
    return arr.to_numpy(zero_copy_only=False)


def list_parts(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Row lengths and values of an integer list array of any layout, in row order.

    Args:
        arr: ``list``, ``large_list``, ``fixed_size_list``, ``list_view`` or
            ``large_list_view`` array without null rows (slices allowed).

    Returns:
        (lengths int64[rows], values: the rows' items back to back, ``sum(lengths)`` long).
        List views (whose rows may overlap or come in any order in the child array) are
        gathered into row order.
    """
    # ``flatten`` honours slices and, for list views, gathers each row's view in row order
    # (a cast of a list view to a list is avoided: pyarrow 26 builds invalid offsets for views
    # that are out of order)
    # lists are sliced straight from their offsets: ``flatten`` (like ``pyarrow.compute``) would
    # import pyarrow's compute module, 0.03 CPU-s of every start-up
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):  # lengths from the offsets, no kernel
        width = np.int64 if pa.types.is_large_list(t) else np.int32
        off = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset:arr.offset + len(arr) + 1]
        start = int(off[0]) if off.size else 0
        values = arr.values.slice(start, int(off[-1]) - start if off.size else 0)
        return np.diff(off).astype(np.int64, copy=False), values
    if pa.types.is_fixed_size_list(t):
        n = t.list_size
        return (np.full(len(arr), n, dtype=np.int64),
                arr.values.slice(arr.offset * n, len(arr) * n))
    # list views: each row's view gathered in row order (``flatten``)
    return numpy_values(arr.sizes).astype(np.int64), arr.flatten()
