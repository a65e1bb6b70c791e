"""What a command's process loads at start: ``stats`` needs neither pandas (pyarrow imports it
for its own conversions when it is installed) nor Numba; Numba's cffi support is off in the
command line's process only, and ``cffi`` stays importable there."""

from __future__ import annotations

import ast
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from packcheck import write_docs
from packtool.formats.arrays import numpy_values


def _modules_after(args: list, names: tuple) -> list:
    """Which of the modules ``names`` a fresh process holds after ``packtool ARGS`` (run
    through the CLI's ``main``, which must succeed)."""
    got = _run(f"""
import sys
from packtool.cli import main
sys.argv = ["packtool", *{[str(a) for a in args]!r}]
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
print(sorted(m for m in {names!r} if m in sys.modules))
""")
    return ast.literal_eval(got.strip().splitlines()[-1])


def _run(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.parametrize("typ", [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(),
                                 pa.uint16(), pa.uint32(), pa.uint64()])
def test_integer_columns_are_viewed_exactly_as_pyarrow_converts_them(typ):
    arr = pa.array([3, 0, 7, 1, 2, 5], typ)
    for a in (arr, arr.slice(2, 3), arr.slice(6), pa.array([], typ)):
        got, want = numpy_values(a), a.to_numpy(zero_copy_only=False)
        assert got.dtype == want.dtype and np.array_equal(got, want)
    offs = pa.array([[1, 2], [], [3, 4, 5]], pa.list_(pa.int32())).slice(1).offsets
    assert np.array_equal(numpy_values(offs), offs.to_numpy())


def test_other_columns_go_through_pyarrow():
    for a in (pa.array([1, None, 3], pa.int32()), pa.array(["a", "b"]), pa.array([1.5, 2.0])):
        got, want = numpy_values(a), a.to_numpy(zero_copy_only=False)
        assert got.dtype == want.dtype
        assert [str(x) for x in got] == [str(x) for x in want]


def test_stats_imports_neither_pandas_nor_numba(tmp_path):
    src = write_docs(tmp_path / "in.parquet", [[1, 2, 3], [4, 5]])
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "packtool", "pack", "-q", "-c", "4", str(src), str(out)],
                   check=True, timeout=300)
    assert _modules_after(["stats", out], ("pandas", "numba")) == []


def test_the_command_line_turns_off_numbas_cffi_support_only(tmp_path):
    """After the CLI's hook, a kernel call does not import cffi's C parser (pycparser), Numba
    records cffi as unsupported, and cffi itself (when installed) still imports."""
    pytest.importorskip("numba")
    got = _run("""
import sys
from packtool.startup import numba_without_cffi
numba_without_cffi()
numba_without_cffi()  # once is enough: a second call adds nothing
from packtool.core import pack_lengths
assert pack_lengths([3, 1], 4).num_rows == 1
from numba.core.typing import cffi_utils
print(cffi_utils.SUPPORTED, "pycparser" in sys.modules)
try:
    import cffi
    print("cffi", cffi.FFI is not None)
except ImportError:
    print("cffi missing")
""")
    lines = got.split("\n")
    assert lines[0] == "False False"
    assert lines[1] in ("cffi True", "cffi missing")


def test_gc_is_held_while_a_command_imports_then_given_back(tmp_path):
    """`python -m packtool stats`: while the command starts, the collector's young-generation
    threshold is raised (it still runs); after its imports the objects made so far are frozen
    and the thresholds are Python's own again."""
    src = write_docs(tmp_path / "in.parquet", [[1, 2, 3], [4, 5]])
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "packtool", "pack", "-q", "-c", "4", str(src), str(out)],
                   check=True, timeout=300)
    got = _run(f"""
import gc, sys
before = gc.get_threshold()
import packtool.startup as s
from packtool.__main__ import main
seen = []
release = s.release_gc
def spy(**kw):
    seen.append(gc.get_threshold())
    release(**kw)
s.release_gc = spy
sys.argv = ["packtool", "stats", {str(out)!r}]
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
print(before == gc.get_threshold(), seen[0][0], gc.get_freeze_count() > 1000)
""")
    assert got.strip().splitlines()[-1] == f"True {1_000_000} True"


def test_hold_and_release_restore_whatever_thresholds_were_set():
    import gc

    from packtool import startup

    was = gc.get_threshold()
    try:
        gc.set_threshold(500, 7, 3)
        startup.hold_gc()
        startup.hold_gc()  # held once: the second call keeps the first's saved thresholds
        assert gc.get_threshold() == (startup._START_THRESHOLD, 7, 3)
        startup.release_gc()
        assert gc.get_threshold() == (500, 7, 3)
        startup.release_gc()  # not held: nothing
        assert gc.get_threshold() == (500, 7, 3)
    finally:
        gc.unfreeze()
        gc.set_threshold(*was)


def test_list_parts_of_every_layout_equal_a_python_recount():
    """Row lengths and values of list, large_list, fixed_size_list and (out-of-order) list
    views, whole and sliced: the rows in order, as Python sees them."""
    from packtool.formats.reader import list_parts

    rows = [[5, 6], [], [7], [8, 9, 10]]
    views = pa.ListViewArray.from_arrays(pa.array([3, 0, 2, 4], pa.int32()),
                                         pa.array([2, 0, 1, 3], pa.int32()),
                                         pa.array([1, 2, 7, 5, 6, 8, 9, 10], pa.int32()))
    fixed = pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int32(), 2))
    arrays = [pa.array(rows, pa.list_(pa.int32())), pa.array(rows, pa.large_list(pa.int64())),
              views, fixed]
    for arr in arrays:
        for a in (arr, arr.slice(1), arr.slice(1, 2), arr.slice(len(arr))):
            lengths, values = list_parts(a)
            want = a.to_pylist()
            assert lengths.tolist() == [len(r) for r in want]
            assert values.to_pylist() == [v for r in want for v in r]


def test_pack_of_a_list_input_imports_neither_pandas_nor_pyarrow_compute(tmp_path):
    src = write_docs(tmp_path / "in.parquet", [[1, 2, 3], [4, 5]])
    args = ["pack", "-q", "-c", "4", src, tmp_path / "out"]
    assert _modules_after(args, ("pandas", "pyarrow.compute")) == []


@pytest.mark.parametrize("args", [["--version"], ["pack", "--bogus"], ["upgrade", "nowhere"]])
def test_the_collector_is_given_back_on_every_way_out(args):
    """A command that ends early (a usage error, --version) or that has no work to import
    still leaves Python's thresholds as they were, when main() runs inside someone's process."""
    got = _run(f"""
import gc
from packtool.__main__ import main
import sys
sys.argv = ["packtool", *{args!r}]
before = gc.get_threshold()
try:
    main()
except SystemExit:
    pass
print(gc.get_threshold() == before)
""")
    assert got.strip().splitlines()[-1] == "True"


def test_min_fill_given_as_a_fraction_or_decimal_is_the_number_it_names():
    from fractions import Fraction

    from packtool.config import PackConfig

    for value, want in ((Fraction(1, 2), 0.5), (Fraction(1, 3), 1 / 3), (np.float32(0.7), 0.7)):
        assert PackConfig(inputs=("x",), output="y", min_fill=value).min_fill == want


_BLAS_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
_THREADS_AFTER_NUMPY = """
import os
{before}
import numpy
print(len(os.listdir("/proc/self/task")), "OPENBLAS_NUM_THREADS" in os.environ)
"""


def _threads_after_numpy(before: str = "", **env: str) -> tuple[int, bool]:
    """(threads of a fresh process once NumPy is imported, OPENBLAS_NUM_THREADS still set),
    with no BLAS thread count in the environment but ``env``."""
    import os

    clean = {k: v for k, v in os.environ.items() if k not in _BLAS_VARS} | env
    res = subprocess.run([sys.executable, "-c", _THREADS_AFTER_NUMPY.format(before=before)],
                         capture_output=True, text=True, timeout=300, env=clean)
    assert res.returncode == 0, res.stderr
    threads, left = res.stdout.strip().splitlines()[-1].split()
    return int(threads), left == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_the_command_line_starts_numpy_without_blas_threads():
    """NumPy's OpenBLAS starts one thread per core when NumPy is imported; after the command
    line's hook it starts none, the variable that says so is gone once NumPy is loaded, and a
    thread count the user set wins."""
    plain, _ = _threads_after_numpy()
    if plain == 1:
        pytest.skip("this NumPy's BLAS starts no threads here (one core, or no threaded BLAS)")
    hook = ("from packtool.startup import numpy_with_one_blas_thread as f\n"
            "f()\nf()  # once is enough")
    assert _threads_after_numpy(hook) == (1, False)
    for var in _BLAS_VARS:
        assert _threads_after_numpy(hook, **{var: str(plain)}) == (plain, var == "OPENBLAS_NUM_THREADS")
    cli = ("import sys\nfrom packtool.cli import main\nsys.argv = ['packtool', '--version']\n"
           "try:\n    main()\nexcept SystemExit:\n    pass")
    assert _threads_after_numpy(cli) == (1, False)
