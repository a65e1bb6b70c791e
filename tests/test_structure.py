"""The package's shape: no import cycle (lazy imports inside functions included), one driver,
and a start-up that does not pay for numba."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "packtool"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """Edges module -> packtool module it imports, anywhere in its source (functions too).

    ``from a.b import c`` counts as an edge to ``a.b.c`` when that is a module, else to
    ``a.b``; a relative import is resolved against the importing module.
    """
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        dynamic = "import_module" in path.read_text()
        for node in ast.walk(tree):
            if dynamic and isinstance(node, ast.Constant) and node.value in mods \
                    and node.value != name:
                graph[name].add(node.value)  # a module named for importlib.import_module
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                targets = [node.args[0].value]
            for t in targets:
                while t and t not in mods:  # packtool.x.y where y is a name in module x
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_the_import_graph_of_the_package_has_no_cycle():
    graph = import_graph()
    assert "packtool.pipeline.write" in graph["packtool.pipeline"]
    assert "packtool.core" in graph["packtool"]  # the lazy attributes of the package count
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a made-up graph with a lazy back edge is caught."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(g) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_engines_know_nothing_of_shards_windows_or_output():
    """Engines only map: they import neither the pipeline, the formats nor the OUTPUT owner."""
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("packtool.engines"):
            bad = {d for d in deps if d.startswith(("packtool.pipeline", "packtool.formats",
                                                    "packtool.output"))}
            assert not bad, (name, bad)


def test_the_flow_is_visible_in_the_folders():
    """read -> plan -> layout -> write in the pipeline package, engines beside it."""
    for step in ("read", "plan", "layout", "write"):
        assert (PKG / "pipeline" / f"{step}.py").is_file(), step
    assert (PKG / "engines" / "local.py").is_file() and (PKG / "engines" / "ray_engine.py").is_file()
    graph = import_graph()
    assert "packtool.pipeline.read" not in graph["packtool.pipeline.write"]  # write reads no input
    assert not any(d.startswith("packtool.pipeline") for d in graph["packtool.output"])


def test_one_shard_writer_and_one_sha256_call():
    """Only pipeline/write.py writes shards; a written shard is hashed while it is written, and a
    shard is read back for its sha256 only by the format layer (a shard kept from an
    interrupted run: formats.manifest.shard_entry_of)."""
    writers, hashers = [], []
    for name, path in _modules().items():
        text = path.read_text()
        if "write_shard(" in text and not name.startswith("packtool.formats"):
            writers.append(name)
        if "sha256_of(" in text and not name.startswith("packtool.formats"):
            hashers.append(name)
    assert writers == ["packtool.pipeline.write"] and hashers == []


@pytest.mark.parametrize("code", [
    "import packtool",
    "import packtool.cli",
    "import packtool.verify.loader\nimport packtool.formats.packed",
    "import packtool.loader\nfrom packtool.loader import PackedDataset, PackedIterableDataset",
    "from packtool.cli import cli\nfrom click.testing import CliRunner\n"
    "assert CliRunner().invoke(cli, ['--help']).exit_code == 0\n"
    "assert CliRunner().invoke(cli, ['--version']).exit_code == 0\n"
    "assert CliRunner().invoke(cli, ['pack', '--help']).exit_code == 0",
])
def test_start_up_does_not_import_numba(code):
    """--help, --version, a bare import and the loaders never load numba or the kernels."""
    probe = code + "\nimport sys\nbad = [m for m in sys.modules if m.split('.')[0] == 'numba'" \
                   " or m == 'packtool.core._kernels']\nassert not bad, bad[:5]\n"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_lazy_attributes_still_work():
    import packtool

    assert callable(packtool.pack_lengths) and packtool.IGNORE_INDEX == -100
    with pytest.raises(AttributeError):
        packtool.no_such_name


#: packages and modules that read a packed output (or lay one out) without touching Parquet
NO_PYARROW = ("packtool.loader", "packtool.analysis", "packtool.verify", "packtool.core",
              "packtool.pipeline", "packtool.engines", "packtool.stats", "packtool.cli",
              "packtool.output", "packtool.location")


def _imports(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_only_the_format_layer_imports_pyarrow():
    """The loader, stats, verify, core, pipeline, engines, the CLI and the OUTPUT owner import no
    pyarrow, nor does the location type: Parquet and the filesystem calls are the format layer's
    (packtool/formats/, the latter in formats/filesystem.py)."""
    bad = sorted(name for name, path in _modules().items()
                 if name.startswith(NO_PYARROW) and "pyarrow" in _imports(path))
    assert bad == []


def test_the_check_above_can_fail(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f():\n    import pyarrow.parquet as pq\n")
    assert "pyarrow" in _imports(p)


def test_the_packed_output_is_read_only_through_the_one_reader():
    """Nothing outside packtool/formats/ opens Parquet, and everything that reads a packed
    output's rows goes through packtool.formats.packed (the loader's datasets, stats, verify,
    pack_dataset's read-back and export --to nemo)."""
    opens = ("ParquetFile(", "read_table(", "read_row_group", "iter_batches(", "read_metadata(")
    bad = sorted(name for name, path in _modules().items()
                 if not name.startswith("packtool.formats")
                 and any(o in path.read_text() for o in opens))
    assert bad == []
    graph = import_graph()
    for reader in ("packtool.loader.source", "packtool.analysis", "packtool.verify.checks",
                   "packtool.formats.inmemory", "packtool.formats.nemo"):
        assert "packtool.formats.packed" in graph[reader], reader
    assert not (PKG / "loader" / "_shards.py").exists()


@pytest.mark.parametrize("command", [["stats"], ["stats", "--no-hash"], ["verify", "--data-only"],
                                     ["verify", "--rows", "1", "--backend", "sdpa"]])
def test_stats_and_verify_of_a_packed_output_never_load_numba(tmp_path, command):
    """packtool stats OUT and packtool verify OUT read the output without the packer's JIT."""
    if command[0] == "verify" and "--data-only" not in command:
        pytest.importorskip("torch")
    from click.testing import CliRunner

    from packtool.cli import cli

    src = tmp_path / "in.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": pa.array([[1, 2, 3], [4, 5], [6, 7, 8, 9]])}), src)
    out = tmp_path / "out"
    assert CliRunner().invoke(cli, ["pack", "-q", "-c", "8", str(src), str(out)]).exit_code == 0
    probe = ("from packtool.cli import cli\nfrom click.testing import CliRunner\n"
             f"r = CliRunner().invoke(cli, {command + [str(out)]!r})\n"
             "assert r.exit_code == 0, r.output\nimport sys\n"
             "bad = [m for m in sys.modules if m.split('.')[0] == 'numba']\nassert not bad, bad[:5]\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
