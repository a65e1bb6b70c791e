"""Arrow arrays as NumPy, without pyarrow's conversion call (see :func:`numpy_values`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["numpy_values"]


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
    t = arr.type
    if pa.types.is_integer(t) and not arr.null_count:
        dtype = np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
        buf = arr.buffers()[1]
        if buf is None:
            return np.zeros(0, dtype=dtype)
        return np.frombuffer(buf, dtype=dtype)[arr.offset:arr.offset + len(arr)]
    return arr.to_numpy(zero_copy_only=False)
