"""packtool from Python: ``pack`` (the CLI's ``pack`` as a function) and ``pack_dataset`` (rows of
an in-memory dataset packed in memory).

:func:`pack_dataset` takes a Hugging Face ``datasets.Dataset`` or ``IterableDataset`` (or a
``DatasetDict`` of them), a ``pyarrow.Table`` or a list of token sequences, and returns the same
kind of object holding the packed rows of the output contract (README, "Output contract").
There is one pipeline: the documents are streamed batch by batch into one Arrow IPC file in a
temporary directory (:mod:`packtool.formats.inmemory`), :func:`packtool.pipeline.run_pack`
packs it exactly as ``packtool pack`` would, and the rows are read back. So the rows equal those
of ``packtool pack`` on the same documents with the same options, byte for byte, and every rule
of the CLI (masks, BOS/EOS, overflow, errors naming the row) holds.

Memory: a ``Dataset``, a ``Table`` and a list come back in memory (as TRL's ``pack_dataset``
does); an ``IterableDataset`` is written to disk one batch at a time, packed in bounded memory
and read back lazily from the packed output, which stays on disk (a temporary directory removed
when no dataset derived from the result is left, or ``output``) while it is iterated.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import re
import shutil
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import Sequence

from packtool.errors import ConfigError, InputError, ManifestError, PacktoolError, PackWarning
from packtool.types import Engine, LabelMode, Overflow, Strategy

__all__ = ["pack", "pack_dataset"]

#: Documents written to the temporary input per batch (Arrow record batches).
BATCH_ROWS = 8192


#: Values an option may take, as its messages write them (quoted when renamed for Python).
_CHOICES = {**{name: tuple(e.value for e in enum) for name, enum in (
    ("strategy", Strategy), ("overflow", Overflow), ("labels", LabelMode), ("engine", Engine))},
    "compression": ("zstd", "lz4")}
_FLAG = re.compile(r"(?<![\w./-])--[a-z][a-z0-9-]*")
_QUOTED = re.compile("'[^']*'|\"[^\"]*\"")
#: flags of the command line a Python caller has no keyword for, in words
_NO_KEYWORD = {"--holdout-output": "the held-out output"}
#: A value written after a flag: a repr, a number, a placeholder (NAME), an object shown by its
#: type (``<pandas.DataFrame>``, :func:`packtool.config.shown_value`), or any word ending in
#: the ":" of ``--NAME VALUE: must be ...`` (``[8, 9]``, ``np.float64(8.0)``).
_VALUE = re.compile(r"""\[[^\]]*\](?=:(?:\s|$))|<[^<>]*>(?=:(?:\s|$))|\S+?(?=:(?:\s|$))"""
                    r"""|'[^']*'|"[^"]*"|-?\d[\w.+-]*|True\b|False\b|None\b|[A-Z][A-Z_]*\b""")


@functools.lru_cache(maxsize=4)
def _keywords_of(fn) -> dict:
    """The Python keyword of every option of ``fn`` (:func:`pack` or :func:`pack_dataset`,
    which has no ``holdout_output``), by the command-line flag that names it in messages
    (``--pad-id`` -> ``pad_id``), with its default."""
    fn = inspect.unwrap(fn)
    out = {"--inputs": ("inputs", None)}
    for name, p in inspect.signature(fn).parameters.items():
        out["--" + name.replace("_", "-")] = (name, p.default)
    return out


def _as_python(message: str, keywords: dict, protect: Sequence[str] = ()) -> str:
    """``message`` (an error or warning written for the command line) with each option of the
    Python API named as its keyword: ``--pad-id 1.5`` -> ``pad_id=1.5``, ``--overflow split`` ->
    ``overflow='split'``, ``--overwrite`` -> ``overwrite=True``, ``--no-shuffle`` ->
    ``shuffle=False``, ``--attention-mask-column none`` -> ``attention_mask_column=None``; flags
    the API has no keyword for stay as they are. Nothing inside quotes or inside one of the
    ``protect`` strings (the caller's paths and column names, as given) is touched.

    Args:
        message: the command line's wording.
        keywords: flag -> (keyword, default) of the function called (:func:`_keywords_of`).
        protect: strings to leave as they are wherever they occur.
    """
    spans = [m.span() for m in _QUOTED.finditer(message)]
    for text in protect:
        if text and "--" in text:
            spans += [(m.start(), m.end()) for m in re.finditer(re.escape(text), message)]
    out, at = [], 0
    for m in _FLAG.finditer(message):
        if m.start() < at or any(a <= m.start() < z for a, z in spans):
            continue
        text, end = _keyword(m.group(0), message, m.end(), keywords)
        out += [message[at:m.start()], text]
        at = end
    return "".join(out) + message[at:]


def _keyword(flag: str, message: str, end: int, keywords: dict) -> tuple[str, int]:
    """(``flag`` as a Python keyword, with the value written after it when there is one;
    where in ``message`` the rewritten text ends)."""
    if flag == "--no-shuffle":
        return "shuffle=False", end
    if flag not in keywords:
        return _NO_KEYWORD.get(flag, flag), end
    name, default = keywords[flag]
    choices = "|".join(_CHOICES.get(name, ()))
    words = re.compile(rf" ((?:{choices})(?:\|(?:{choices}))*)\b").match(message, end) \
        if choices else None
    if words:
        return f"{name}=" + "|".join(repr(w) for w in words.group(1).split("|")), words.end()
    if name.endswith("column"):  # a column name written bare, or none (the mask is not read)
        bare = re.compile(r" (none\b|(?![A-Z][A-Z_]*\b)[A-Za-z_][\w.-]*(?=[),;]|$))").match(
            message, end)
        if bare:
            word = bare.group(1)
            return f"{name}={None if word == 'none' else repr(word)}", bare.end()
    value = _VALUE.match(message, end + 1) if message.startswith(" ", end) else None
    if value:
        return f"{name}={value.group(0)}", value.end()
    return (f"{name}=True" if default is False else name), end


def _python_errors(fn):
    """Run ``fn`` with every :class:`PacktoolError` it raises reworded for Python
    (:func:`_as_python`, the paths and names passed left as they are), same class."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PacktoolError as exc:
            raise type(exc)(_as_python(str(exc), _keywords_of(fn),
                                       _given_strings(args, kwargs))) from None
    return wrapper


def _given_strings(args, kwargs) -> list[str]:
    """The strings (and paths) among a call's arguments, one level into lists: what a message
    may quote of them."""
    out = []
    for v in [*args, *kwargs.values()]:
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(x, (str, os.PathLike)):
                out.append(os.fspath(x))
    return out


def _warn(result, fn) -> None:
    """Issue the ``WARNING`` notes of a pack (and of its held-out pack, said so) as
    :class:`~packtool.errors.PackWarning` s, worded for a caller of ``fn``."""
    level = _caller_level()
    for r, whose in ((result, ""), (getattr(result, "holdout", None), "held-out pack: ")):
        for note in (getattr(r, "warnings", None) or ()):
            warnings.warn(whose + _as_python(note, _keywords_of(fn)), PackWarning,
                          stacklevel=level)


def _caller_level() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller of this function name the
    first frame outside packtool (the user's line, however many packtool frames are between:
    ``pack_dataset`` of a ``DatasetDict`` calls itself per split)."""
    import sys

    root = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(root):
        frame, level = frame.f_back, level + 1
    return level


def _config(inputs, output, **options):
    """The :class:`PackConfig` of these arguments: it checks every one (type, then range) and
    names the bad one; ``workers=None`` is every core."""
    from packtool.config import PackConfig

    workers = options.pop("workers", None)
    return PackConfig(inputs=inputs, output=output,
                      workers=(os.cpu_count() or 1) if workers is None else workers, **options)


@_python_errors
def pack(inputs: str | os.PathLike | Sequence[str | os.PathLike], output: str | os.PathLike, *,
         capacity: int = 2048, column: str = "input_ids", strategy: str = "obfd",
         overflow: str = "split", segment_multiple: int = 1, labels: str = "none",
         min_fill: float = 0.0, pad_id: int = 0, append_eos: int | None = None, prepend_bos: int | None = None,
         attention_mask_column: str | None = "auto", labels_column: str | None = "auto",
         loss_mask_column: str | None = "auto", skip_unsupported: bool = False,
         seed: int = 0, shuffle: bool = True, rows_per_shard: int = 8192,
         row_group_mb: float = 1.0, compression: str = "zstd", workers: int | None = None,
         overwrite: bool = False, window_docs: int | None = None, engine: str = "local",
         ray_address: str | None = None,
         holdout: float | None = None, holdout_output: str | os.PathLike | None = None,
         source_column: str | None = None, progress: bool = False):
    """``packtool pack INPUT... OUTPUT`` as a function: same options (keyword names are the
    option names with ``_``; ``shuffle=False`` is ``--no-shuffle``), same output, same errors.

    Args:
        inputs: one INPUT or a list of them (files, directories, URIs).
        output: OUTPUT directory (or URI).
        progress: progress bars on stderr (when it is a terminal).

    Returns:
        :class:`packtool.pipeline.PackResult`: ``stats`` (the summary's counts,
        :class:`packtool.stats.PackStats`; ``stats.to_dict()`` is the ``"stats"`` member of
        what ``pack --json`` prints),
        ``manifest``, ``seconds``, ``warnings``, ``already_complete``, and ``holdout`` (the
        held-out pack's result) with ``holdout=``.

    Raises:
        ConfigError: an argument of the wrong type (a float, bool or string for an integer, a
            non-bool flag; :func:`packtool.config.option_value`) or out of range, named by its
            keyword: ``pad_id=1.5: must be an integer, not float``; ``inputs`` that are not
            paths (a Dataset, Table, DataFrame or token lists: the message names
            :func:`pack_dataset`).
        LocationError: an INPUT or OUTPUT that names no location (an empty path, a ``file:``
            URI of another host or of no absolute path), before any work.
        InputError, SchemaError, PackingError, OutputError, EngineError: as ``packtool pack``;
            the message names the file, the row and the fix, options by their keywords
            (``pass overwrite=True``).

    Warns:
        PackWarning: each ``WARNING`` note of the pack (tokens left out by ``overflow`` or
            ``min_fill``, no effective targets), worded for Python.
    """
    from packtool.config import option_value
    from packtool.pipeline import run_pack

    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    _require_paths(inputs)
    progress = option_value("progress", progress, "bool")
    cfg = _config(inputs, output, capacity=capacity, column=column, strategy=strategy,
                  overflow=overflow, segment_multiple=segment_multiple, labels=labels,
                  min_fill=min_fill, pad_id=pad_id, append_eos=append_eos,
                  prepend_bos=prepend_bos, attention_mask_column=attention_mask_column,
                  labels_column=labels_column, loss_mask_column=loss_mask_column,
                  skip_unsupported=skip_unsupported, seed=seed, shuffle=shuffle,
                  rows_per_shard=rows_per_shard, row_group_mb=row_group_mb,
                  compression=compression, workers=workers, overwrite=overwrite,
                  window_docs=window_docs, engine=engine,
                  ray_address=ray_address, holdout=holdout,
                  holdout_output=holdout_output, source_column=source_column)
    result = run_pack(cfg, progress=progress)
    _warn(result, pack)
    return result


#: How a message says where documents in memory go.
_IN_MEMORY = ("documents in memory (token lists, a datasets.Dataset, pyarrow.Table or "
              "pandas DataFrame) are packed with packtool.pack_dataset(data, capacity=...)")


def _require_paths(inputs) -> None:
    """Refuse ``inputs`` of :func:`pack` that are not a list or tuple of paths: documents
    handed over in memory (a Dataset, a Table, a DataFrame, token lists) belong to
    :func:`pack_dataset`, which the one-line message names (the object by its type, never its
    printed form).

    Raises:
        ConfigError: ``inputs`` is not a list or tuple, or an item of it is not a path.
    """
    from packtool.config import shown_value, type_name

    if not isinstance(inputs, (list, tuple)):
        raise ConfigError(f"inputs={shown_value(inputs)}: must be a path or a list of paths "
                          f"(files, directories or URIs), not {type_name(inputs)}; "
                          f"{_IN_MEMORY}")
    for i, item in enumerate(inputs):
        if not isinstance(item, (str, os.PathLike)):
            raise ConfigError(f"inputs[{i}]={shown_value(item)}: must be a path (a file, "
                              f"directory or URI), not {type_name(item)}; {_IN_MEMORY}")


#: The live owner of each temporary directory of this process, by path: what a copy of an
#: ``IterableDataset`` made from it shares (:meth:`_Owner.__reduce__`).
_OWNERS = weakref.WeakValueDictionary()


class _Owner:
    """Keeps a temporary directory of packed outputs alive while an ``IterableDataset`` made from
    it, a copy of one or a dataset derived from one exists, and removes it after the last one
    (or as the process ends, a Ctrl-C included).

    A copy is the owner itself: ``copy.copy``, ``copy.deepcopy`` (what ``interleave_datasets``
    and ``concatenate_datasets`` do) and a pickle round trip in the same process all give the
    one object, so each copy keeps the directory as long as it lives. In another process (a
    ``spawn`` DataLoader worker) a pickled owner only names the directory; in a ``fork``ed one
    the inherited owner never removes it: only the process that made the directory does.
    """

    def __init__(self, path: str, owned: bool = False) -> None:
        self.path = path
        self.pid = os.getpid()
        if owned:
            _OWNERS[path] = self
            weakref.finalize(self, _remove_owned, path, self.pid)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return (_owner_of, (self.path, self.pid))

    def gone_error(self) -> PacktoolError:
        """The one-line error for this directory's packed output found removed."""
        return ManifestError(
            f"{self.path}: the temporary output of pack_dataset holding this IterableDataset's "
            "rows was removed (by hand or by a cleaner of the temporary directory); pack again, "
            "and pass output=DIR to keep the packed output in a directory of your own")


def _owner_of(path: str, pid: int) -> _Owner:
    """The owner a pickled :class:`_Owner` of ``path`` (made in process ``pid``) stands for
    here: the live one of this process when there is one, else one that only names it."""
    owner = _OWNERS.get(path) if pid == os.getpid() else None
    return owner if owner is not None else _Owner(path)


def _remove_owned(path: str, pid: int) -> None:
    """Remove the temporary directory ``path`` in the process that made it (``pid``), never in a
    ``fork``ed child that inherited its owner."""
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


def _iter_packed_rows(path: str, groups: list, owner: _Owner | None = None):
    """The rows of row groups ``groups`` of the packed output ``path``, in order: the
    ``datasets`` library hands each DataLoader worker a contiguous share of the list.

    Raises:
        ManifestError: the packed output is not there; of ``owner``'s temporary directory, the
            message says pack_dataset's temporary output was removed and how to keep one.
    """
    from packtool.formats.inmemory import packed_batches

    if owner is not None and not os.path.isdir(path):
        raise owner.gone_error()
    for batch in packed_batches(path, groups):
        yield from batch.to_pylist()


def _as_documents(data):
    """A tuple of documents, a 2-D NumPy array or tensor (one document per row), or a 1-D NumPy
    object array of documents (lists, arrays, tensors or dicts: a pandas column's
    ``to_numpy()``), as the list of documents the list input takes; anything else unchanged.

    Raises:
        InputError: any other NumPy array (a 1-D array of ids is one document: wrap it in a
            list).
    """
    from packtool.formats.inmemory import is_tensor, plain_array

    if isinstance(data, tuple):
        return list(data)
    mod = type(data).__module__ or ""
    if mod.startswith("pandas") and type(data).__name__ == "Series":
        data, mod = data.to_numpy(), "numpy"  # its values, one document each (not the index)
    if is_tensor(data) and getattr(data, "ndim", None) == 2:  # as the 2-D array of its values
        data, mod = plain_array(data), "numpy"
    if mod == "numpy" and type(data).__name__ == "ndarray":
        import numpy as np
        from collections.abc import Mapping

        if data.ndim == 1 and data.dtype == object and (not data.size or any(
                isinstance(d, (list, tuple, np.ndarray, Mapping)) or is_tensor(d)
                for d in data)):
            return list(data)  # documents, each judged as an item of a list
        if data.ndim != 2:
            raise InputError(f"pack_dataset takes a 2-D NumPy array (one document per row) or "
                             f"a 1-D object array of documents (lists or arrays), not a "
                             f"{_array_words(data)}; one document of ids is [array]")
        return list(data)  # rows as arrays: their dtype is judged as a column of them
    return data


def _array_words(data) -> str:
    """What a NumPy array that is no documents holds, for a message: ``1-D array of int64``,
    ``1-D object array of int`` (the types of its values), ``0-D one``."""
    if data.ndim != 1:
        return f"{data.ndim}-D one"
    if data.dtype != object:
        return f"1-D array of {data.dtype}"
    names = sorted({type(v).__name__ for v in data if v is not None}) or ["None"]
    return f"1-D object array of {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"


def _kind(data, column: str = "input_ids") -> str:
    """What ``data`` (after :func:`_as_documents`) is to :func:`pack_dataset`: ``list``,
    ``table``, ``DataFrame`` (pandas), ``columns`` (a mapping of column -> one value per row:
    a ``dict``, what a tokenizer call returns), ``to_arrow`` (an object whose ``to_arrow()``
    gives a ``pyarrow.Table``: a polars DataFrame) or the name of a ``datasets`` type.

    Raises:
        InputError: any other type (named with its package, with the conversion that fits:
            ``pyarrow.table({column: it})`` for a pyarrow array, ``.collect()`` for a polars
            LazyFrame).
    """
    from collections.abc import Mapping

    from packtool.config import type_name
    from packtool.formats.inmemory import is_arrow_table

    if isinstance(data, list):
        return "list"
    if is_arrow_table(data):
        return "table"
    mod = type(data).__module__ or ""
    if mod.startswith("pandas") and type(data).__name__ == "DataFrame":
        return "DataFrame"  # never import pandas for anything else
    if mod.startswith("datasets"):  # never import datasets for anything else
        name = type(data).__name__
        if name in ("Dataset", "IterableDataset", "DatasetDict", "IterableDatasetDict"):
            return name
    if isinstance(data, Mapping):  # a DatasetDict is one too: named above
        return "columns"
    if callable(getattr(data, "to_arrow", None)):
        return "to_arrow"
    hint = "for files on disk use packtool.pack(INPUT, OUTPUT)"
    if inspect.isgenerator(data) or (callable(getattr(data, "__next__", None))
                                     and callable(getattr(data, "__iter__", None))):
        hint = ("a generator or iterator of documents: pass list(...) of it, or stream it "
                "with datasets.IterableDataset.from_generator (or Dataset.from_generator); "
                + hint)
    method = next((m for m in ("to_list", "tolist") if callable(getattr(data, m, None))), None)
    if mod.startswith("pyarrow") and callable(getattr(data, "to_pylist", None)):
        # an Array or ChunkedArray: a table of it keeps its type
        listed = ".tolist()" if method else ".combine_chunks().tolist()"
        hint = (f"a column of documents: pass pyarrow.table({{{column!r}: it}}) (or its "
                f"{listed}, one list of ids per document); " + hint)
    elif type_name(data) == "polars.LazyFrame":
        hint = "a polars LazyFrame: pass its .collect() (the DataFrame of its rows); " + hint
    elif method is not None:
        hint = (f"a column of documents: pass its .{method}() (one list of ids per document); "
                + hint)
    raise InputError(f"pack_dataset takes a datasets.Dataset, IterableDataset, DatasetDict, a "
                     f"pyarrow.Table, a pandas or polars DataFrame, a pandas Series, a dict of "
                     f"columns (what a tokenizer returns), a list of token sequences or a 2-D "
                     f"NumPy array, not {type_name(data)}; {hint}")


def _kind_or_none(data) -> str | None:
    """:func:`_kind` of a dataset, table or frame (``list`` of a list); None for any other
    value (a column's values that are no container pack_dataset takes)."""
    try:
        kind = _kind(data)
    except InputError:
        return None
    return None if kind == "list" else kind


def _columns_table(data, column: str, batch_rows: int):
    """The batches of a mapping of column -> one value per row (``dict``, a tokenizer's
    ``BatchEncoding``; values lists, NumPy arrays or tensors), ``batch_rows`` rows at a time,
    typed as the rows of a list of dicts (:func:`~packtool.formats.inmemory.tables_from_dicts`).

    Raises:
        InputError: no ``column`` key (the keys named), a value without a length, columns of
            different lengths, or a token column of one document (ids, not lists of ids).
    """
    from packtool.config import shown_value, type_name
    from packtool.formats.inmemory import tables_from_dicts

    keys = [str(k) for k in data]
    if not keys:
        raise InputError("no documents: the dict of columns is empty")
    if column not in data:
        if all(_kind_or_none(v) not in (None, "columns") for v in data.values()):
            raise InputError(f"a dict of {len(data)} datasets ({shown_value(keys)}) is no dict "
                             "of columns; pack each one, or wrap them in datasets.DatasetDict "
                             "(each split packed on its own)")
        raise InputError(f"the dict of columns has no column {column!r} (columns: "
                         f"{shown_value(keys)}); pass column=NAME, or a list of token sequences")
    sizes = {}
    for k in data:
        try:
            sizes[k] = len(data[k])
        except TypeError:
            raise InputError(f"column {str(k)!r} of the dict of columns is of type "
                             f"{type_name(data[k])}, not a list of one value per row") from None
    if len(set(sizes.values())) > 1:
        said = ", ".join(f"{str(k)!r} {n}" for k, n in sizes.items())
        raise InputError(f"the dict of columns holds columns of different lengths ({said}); "
                         "give one value per row in every column")
    tokens = data[column]
    first = tokens[0] if sizes[column] else None
    if first is not None and not hasattr(first, "__len__") and hasattr(first, "__index__"):
        raise InputError(f"column {column!r} of the dict of columns holds ids, one document "
                         "(tokenizer(text) of one string); pass a list of documents "
                         "(tokenizer(list_of_texts)), or wrap it: {" + repr(column) + ": [ids]}")
    n = sizes[column]
    return tables_from_dicts(({k: data[k][a:a + batch_rows] for k in data}
                              for a in range(0, n, batch_rows)), column)


def _read_columns(attention_mask, labels, loss_mask) -> list[str]:
    """The mask columns ``pack`` reads: those the options name, and under ``auto`` the
    default names (:mod:`packtool.formats.reader`), so a present column of the wrong type
    reaches ``pack``'s check and is refused as the CLI refuses it, never dropped in silence."""
    from packtool.formats.reader import (ATTENTION_MASK_COLUMN, AUTO, LABELS_COLUMN,
                                         LOSS_MASK_COLUMNS)

    cols = []
    for option, defaults in ((attention_mask, (ATTENTION_MASK_COLUMN,)),
                             (labels, (LABELS_COLUMN,)), (loss_mask, LOSS_MASK_COLUMNS)):
        if option is None or str(option).lower() == "none":
            continue
        cols += list(defaults) if str(option).lower() == AUTO else [str(option)]
    return cols


def _batches(data, kind: str, column: str, batch_rows: int):
    from packtool.formats.inmemory import table_from_list, tables_from_dicts

    if kind == "list":
        return [table_from_list(data, column)]
    if kind == "table":
        return [data]
    if kind == "columns":
        return _columns_table(data, column, batch_rows)
    if kind == "DataFrame":
        from packtool.formats.inmemory import table_from_pandas

        return [table_from_pandas(data, column)]
    if kind == "IterableDataset" and data.features is None:  # typed by us, batch by batch
        return tables_from_dicts(data.iter(batch_size=batch_rows), column)
    if kind == "IterableDataset":
        from packtool.formats.inmemory import streamed_tables

        return streamed_tables(data, column, batch_rows)
    if kind == "Dataset" and _transform_of(data):  # its rows as the caller reads them
        return tables_from_dicts(data.iter(batch_size=batch_rows), column)
    # a Dataset's rows in order (select, shuffle and filter indices applied), batch by batch;
    # a plain format (numpy, torch) changes no value: its Arrow batches are read as stored,
    # with the columns the format shows (``set_format(columns=...)``)
    shown = _format_columns(data)
    if shown is not None and column not in shown and column in data.column_names:
        raise InputError(f"the dataset's format hides its column {column!r} (set_format or "
                         f"with_format columns={shown!r}); include it, or call reset_format()")
    return data.with_format("arrow", columns=shown).iter(batch_size=batch_rows)


def _format_columns(data) -> list | None:
    """The columns a ``datasets.Dataset``'s format shows (``set_format(columns=...)``, unless
    ``output_all_columns``); None: all of them."""
    fmt = getattr(data, "format", None)
    if not isinstance(fmt, dict) or fmt.get("output_all_columns"):
        return None
    return fmt.get("columns")


def _transform_of(data) -> bool:
    """True for a ``datasets.Dataset`` with a transform (``with_transform`` /
    ``set_transform``: its format type is ``custom``): its rows are what the transform returns,
    not the stored ones."""
    fmt = getattr(data, "format", None)
    return isinstance(fmt, dict) and fmt.get("type") == "custom"


@_python_errors
def pack_dataset(data, capacity: int = 2048, *, column: str = "input_ids",
                 strategy: str = "obfd", overflow: str = "split", segment_multiple: int = 1,
                 labels: str = "none", min_fill: float = 0.0,
                 pad_id: int = 0, append_eos: int | None = None, prepend_bos: int | None = None,
                 attention_mask_column: str | None = "auto", labels_column: str | None = "auto",
                 loss_mask_column: str | None = "auto", source_column: str | None = None,
                 shuffle: bool = True, seed: int = 0, window_docs: int | None = None,
                 holdout: float | None = None, rows_per_shard: int = 8192,
                 row_group_mb: float = 1.0, compression: str = "zstd",
                 workers: int | None = None, output: str | os.PathLike | None = None,
                 overwrite: bool = False,
                 batch_rows: int = BATCH_ROWS, progress: bool = False):
    """Pack the documents of an in-memory dataset into rows of exactly ``capacity`` tokens.

    The keywords are ``packtool pack``'s options (``shuffle=False`` is ``--no-shuffle``); the rows
    are those ``packtool pack`` writes for the same documents in the same order with the same
    options.

    Args:
        data: one document per row, tokens in ``column`` (a list of integer ids):
            ``datasets.Dataset`` / ``IterableDataset`` (their rows in iteration order, a
            ``with_transform`` / ``set_transform`` applied, read in batches; an
            ``IterableDataset`` is read one batch of ``batch_rows`` at a time), a
            ``DatasetDict`` / ``IterableDatasetDict`` (each split packed on its own), a
            ``pyarrow.Table``, a list or tuple of token sequences (lists, NumPy arrays or 1-D
            integer tensors, on any device: read as the NumPy arrays of their values; or dicts
            of columns: the
            union of their keys, a key missing from a dict null in its row, as in one Parquet
            file of those rows; a stream's batches likewise), or
            a 2-D NumPy array or tensor of integer ids (one document per row, all of its
            width), or a
            1-D NumPy object array of documents (a pandas column's ``to_numpy()``), a
            ``pandas.Series`` of documents, a ``pandas.DataFrame`` (its columns; tensors in
            its cells as in a list), a mapping
            of column -> one value per row (a ``dict``; ``BatchEncoding``, what
            ``tokenizer(list_of_texts)`` returns; lists, NumPy arrays or tensors), or an object
            whose ``to_arrow()`` gives a ``pyarrow.Table`` (a ``polars.DataFrame``). A
            ``Dataset``'s format columns (``set_format(columns=...)``) are the only ones read. Mask
            columns (``attention_mask``, ``labels``, TRL's ``completion_mask`` and
            ``assistant_masks``, or the columns ``attention_mask_column``, ``labels_column`` and
            ``loss_mask_column`` name) are applied as by the CLI; text and scalar columns are
            not read (``doc_ids`` in the packed rows index the input rows) unless
            ``source_column`` names one.
        capacity: C, tokens per packed row.
        labels: what the rows store, as ``--labels``: ``none`` (no ``labels`` column unless an
            input labels column or loss mask is read: then ``unshifted``), ``unshifted`` or
            ``shifted``.
        source_column: a column of one string or integer per document (``--source-column``)
            carried into the rows as each segment's ``source_ids``; the id -> value table
            (``sorted(set(values))`` over every document read, empty and left-out ones
            included) is in the manifest (``read_manifest(output).source_values``) and comes
            with the rows: a ``Table``'s schema metadata :data:`SOURCE_VALUES_META_KEY`
            (JSON), a ``DataFrame``'s ``attrs["source_values"]``, a ``Dataset``'s or
            ``IterableDataset``'s ``source_ids`` feature (a list of ``ClassLabel`` named by
            the values, integers as decimal strings; stored as int64); not with a list, dict
            or polars DataFrame.
        holdout: also pack a held-out fraction of the documents (``--holdout``); the result is
            then a pair ``(training rows, held-out rows)``.
        output: keep the packed output (shards and manifest) in this directory; default: a
            temporary one. Its fingerprint is the content of the documents as handed over
            (the columns read, their values and nulls; not the integer width, the container or
            ``batch_rows``) with the options, so the same call again finds the
            output done and reads it back (or resumes an interrupted one); other documents or
            options are refused unless ``overwrite``.
        overwrite: replace a non-empty ``output``.
        batch_rows: documents written to the temporary input per batch (>= 1).

    Returns:
        The type given, holding the packed contract's columns (``input_ids``,
        ``segment_ids``, ``position_ids`` ``int32[C]``, ``labels`` when stored,
        ``cu_seqlens``, ``cu_seqlens_unpadded`` with ``segment_multiple`` > 1, ``max_seqlen``,
        ``num_targets``, ``doc_ids``, ``doc_offsets``, ``source_ids`` with ``source_column``):
        a ``datasets.Dataset`` (in memory), an ``IterableDataset`` (streamed from the packed
        output on disk), a ``DatasetDict`` of those, a ``pyarrow.Table`` (the shards' schema
        and metadata), a ``pandas.DataFrame`` (list columns hold NumPy arrays), a list of
        dicts of Python values, one per row (for a list, tuple, NumPy array or pandas
        Series), a dict of column -> list of Python values (for a mapping), or a
        ``polars.DataFrame`` (for one; another ``to_arrow()`` object: a ``pyarrow.Table``).

        Labels convention (docs/labels.md): the ``labels`` column, when stored, is handed out
        as stored, never converted: ``unshifted`` (``labels[i]`` is token ``i`` or -100; the
        model shifts, as ``HFCollator`` and Hugging Face models expect) unless
        ``labels="shifted"`` (``labels[i]`` is the target of position ``i``). A ``Table``
        names it in its schema metadata (``packtool.labels_convention``), ``output=`` keeps a
        manifest that records it (``read_manifest(output).labels``); without a ``labels``
        column, readers derive ``unshifted`` labels (``HFCollator``, ``PackedDataset``).

    Raises:
        ConfigError: an argument of the wrong type or out of range, as :func:`pack` (checked
            before any document is read or directory made); ``holdout`` or ``output`` with a
            ``DatasetDict`` (each split is packed into its own temporary output: pack the
            splits one by one, each with its ``output``, to keep them).
        LocationError: ``output`` names no location (an empty path, a ``file:`` URI of another
            host or of no absolute path), before any document is read.
        InputError, SchemaError: data that is not a supported type (named with its package,
            in one line), a mapping without ``column`` or of columns of different lengths,
            no documents, a missing
            column (or one the dataset's format hides), token ids that are not integers (floats, bools, strings: refused as the CLI
            refuses a Parquet file of them, never cut), bad token ids or masks (the message
            names the row).
        PackingError: a document over capacity with ``overflow="error"``.
        ResourceError, OutputError: the machine ran short (memory, open files, disk); with
            ``output=`` the message says what it keeps for the same call to finish, without it
            that the temporary output was removed.
        KeyboardInterrupt: Ctrl-C or SIGTERM; with ``output=`` its message says what it keeps
            for the same call to resume, without it that the temporary output was removed
            (:data:`STOPPED_TEMPORARY`).
        Messages name options by their keywords (``pass overwrite=True``).

    Warns:
        PackWarning: each ``WARNING`` note of the pack (tokens left out by ``overflow`` or
            ``min_fill``, no effective targets), worded for Python.
    """
    from packtool.config import option_value
    from packtool.pipeline import run_pack

    data = _as_documents(data)
    kind = _kind(data, column)
    back = kind  # the type the rows are handed back as
    if kind == "to_arrow":
        data, kind, back = _via_arrow(data)
    batch_rows = option_value("batch_rows", batch_rows, "int", minimum=1)
    progress = option_value("progress", progress, "bool")
    options = dict(capacity=capacity, column=column, strategy=strategy, overflow=overflow,
                   segment_multiple=segment_multiple, labels=labels, min_fill=min_fill,
                   pad_id=pad_id, append_eos=append_eos,
                   prepend_bos=prepend_bos, attention_mask_column=attention_mask_column,
                   labels_column=labels_column, loss_mask_column=loss_mask_column,
                   source_column=source_column, shuffle=shuffle, seed=seed,
                   window_docs=window_docs, rows_per_shard=rows_per_shard,
                   row_group_mb=row_group_mb, compression=compression, workers=workers)
    if kind.endswith("DatasetDict"):
        if not data:
            raise InputError(f"no documents: the {kind} holds no split")
        if holdout is not None:
            raise ConfigError("holdout: a DatasetDict has its splits already; pack each split")
        if output is not None:
            raise ConfigError("output: a DatasetDict packs each split into its own temporary "
                              "output; pack the splits one by one to keep them")
        packed = {}
        for name, split in data.items():
            try:
                packed[name] = pack_dataset(split, holdout=None, overwrite=overwrite,
                                            batch_rows=batch_rows, progress=progress, **options)
            except PacktoolError as exc:  # which split: the rows are numbered inside it
                raise type(exc)(f"split {name!r}: {exc}") from None
        return type(data)(packed)
    if kind == "list" and not data:
        raise InputError("no documents: the list is empty")
    from packtool.formats.inmemory import INPUT_DESCRIPTION, INPUT_NAME, write_input

    work = Path(tempfile.mkdtemp(prefix="packtool-"))
    src = work / "input"
    # an IterableDataset is read lazily: its packed output (in work) outlives this call
    lazy = kind == "IterableDataset" and output is None
    done = False
    try:
        # every option is checked before any document is read or written
        cfg = _config([src], work / "packed" if output is None else output,
                      overwrite=overwrite, holdout=holdout, inputs_name=INPUT_DESCRIPTION,
                      **options)
        src.mkdir()
        written, digest = write_input(
            _batches(data, kind, column, batch_rows), src / INPUT_NAME, column,
            _read_columns(attention_mask_column, labels_column, loss_mask_column)
            + ([source_column] if source_column is not None else []),
            fingerprint=output is not None)
        if output is not None:  # the same documents again find their output done (or resume it)
            cfg = dataclasses.replace(cfg, inputs_digest=digest)
        try:
            result = run_pack(cfg, progress=progress)
        except KeyboardInterrupt as exc:
            # without output= the packed output is the temporary one removed below: what it
            # kept for a rerun goes with it
            raise KeyboardInterrupt(str(exc) if output is not None else STOPPED_TEMPORARY) \
                from None
        except PacktoolError as exc:  # name the rows as the caller knows them, not the file
            msg = (str(exc).replace(str(src / INPUT_NAME), "documents")
                   .replace("the INPUT", "the documents")
                   .replace(" in INPUT", " in the documents"))
            if output is not None:
                msg = _other_documents(msg, cfg.output, written)
            raise type(exc)(_rerun_words(msg, output is None)) from None
        _warn(result, pack_dataset)
        owner = _Owner(str(work), owned=True) if lazy else None
        outs = [(cfg.output, result)] + ([(cfg.holdout_output, result.holdout)]
                                         if result.holdout is not None else [])
        packed = tuple(_result(o, back, owner, r.manifest.source_values) for o, r in outs)
        done = True
    finally:
        shutil.rmtree(src if lazy and done else work, ignore_errors=True)
    return packed if holdout is not None else packed[0]


def _via_arrow(data):
    """``(table, "table", back)`` of an object whose ``to_arrow()`` gives its
    ``pyarrow.Table`` (a polars DataFrame); ``back``: ``polars`` for a polars DataFrame (the rows
    are handed back as one), else ``table``.

    Raises:
        InputError: ``to_arrow()`` gave no ``pyarrow.Table`` (a polars Series gives an array).
    """
    from packtool.config import type_name
    from packtool.formats.inmemory import is_arrow_table

    name = type_name(data)
    table = data.to_arrow()
    if not is_arrow_table(table):
        raise InputError(f"pack_dataset takes a table of documents; {name}.to_arrow() gives "
                         f"{type_name(table)}, not a pyarrow.Table; pass a DataFrame holding "
                         "the token column, or .to_list() (one list of ids per document)")
    return table, "table", "polars" if name == "polars.DataFrame" else "table"


#: The message of a ``KeyboardInterrupt`` (Ctrl-C, SIGTERM) that stops :func:`pack_dataset`
#: without ``output=``: its packed output was a temporary directory, removed as the call ends.
STOPPED_TEMPORARY = ("pack_dataset was stopped; its temporary output was removed, so nothing "
                     "is kept to resume from: pass output=DIR to keep a stopped pack's work, "
                     "and the same call again resumes it")

#: What a failure's message says OUTPUT keeps and how to finish it
#: (:meth:`packtool.output.Output._state`): the clause :func:`_rerun_words` rewords.
_KEPT_TO_FINISH = re.compile(
    r"(every shard is finished and kept, only the manifest is missing|no shard was finished "
    r"\([^)]*\)|the finished shards are kept \(\d+\)): rerun the same command to finish")


#: What :func:`packtool.output._differences` says of a finished pack whose options agree.
_OTHER_INPUTS = "a finished pack of other inputs (or another packtool version)"


def _other_documents(message: str, output, docs: int) -> str:
    """``message`` refusing a finished ``output`` of other inputs, worded for
    :func:`pack_dataset`: the documents differ, with the counts (``docs`` handed over now, the
    manifest's ``docs_in``); any other message unchanged."""
    if _OTHER_INPUTS not in message:
        return message
    from packtool.formats.manifest import read_manifest

    try:
        was = read_manifest(output).totals.docs_in
    except PacktoolError:
        return message.replace(_OTHER_INPUTS, "a finished pack of other documents (or "
                               "another packtool version)")
    said = (f"the same number, {docs:,}, with other content; or another packtool version"
            if was == docs else f"{docs:,} documents now, {was:,} in it")
    return message.replace(_OTHER_INPUTS, f"a finished pack of other documents ({said})")


def _rerun_words(message: str, temporary: bool) -> str:
    """A failure's ``message`` from :func:`~packtool.pipeline.run_pack` worded for a caller of
    :func:`pack_dataset`: what OUTPUT keeps for a rerun is said only of an ``output=`` the
    caller gave (the same call again finishes it); of the temporary output (``temporary``),
    removed as the call ends, it says that nothing is kept and how to keep it."""
    if temporary:
        return _KEPT_TO_FINISH.sub(
            "the temporary output was removed, so nothing is kept: pass output=DIR to keep the "
            "finished shards, and the same call again finishes it", message)
    return _KEPT_TO_FINISH.sub(lambda m: f"{m.group(1)}: call pack_dataset again with the same "
                               "documents, options and output to finish", message)


#: Schema metadata key of a ``pyarrow.Table`` that :func:`pack_dataset` returns with
#: ``source_column``: the id -> value table of ``source_ids``, as JSON (a list of strings or
#: integers; id ``i`` is item ``i``).
SOURCE_VALUES_META_KEY = b"packtool.source_values"


def _result(out: str, kind: str, owner: _Owner | None, sources: tuple = ()):
    """The packed rows of the OUTPUT ``out`` (a path or URI, as given) as the type ``kind``
    names, with ``sources`` (the manifest's ``source_values``; empty without
    ``source_column``) attached where the type holds it: a ``Table``'s schema metadata
    (:data:`SOURCE_VALUES_META_KEY`), a ``DataFrame``'s ``attrs["source_values"]``, a
    ``Dataset``'s or ``IterableDataset``'s ``source_ids`` feature (a list of ``ClassLabel``
    whose names are the values, integers as decimal strings)."""
    import json

    from packtool.formats.inmemory import read_packed_table

    if kind == "IterableDataset":
        import datasets

        from packtool.formats.packed import PackedOutput

        reader = PackedOutput.open(out)  # the manifest's schema and the row-group count, once
        groups = list(range(reader.num_row_groups))
        features = _with_source_names(datasets.Features.from_arrow_schema(reader.schema),
                                      sources)
        reader.close()
        # one dataset shard per row group, so DataLoader workers read in parallel
        return datasets.IterableDataset.from_generator(
            _iter_packed_rows, features=features,
            gen_kwargs={"path": str(out), "groups": groups, "owner": owner})
    table = read_packed_table(out)
    if sources:
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), SOURCE_VALUES_META_KEY: json.dumps(list(sources))})
    if kind == "list":
        return table.to_pylist()
    if kind == "table":
        return table
    if kind == "columns":
        return table.to_pydict()
    if kind == "polars":
        import polars

        return polars.from_arrow(table)
    if kind == "DataFrame":
        from packtool.formats.inmemory import table_to_pandas

        frame = table_to_pandas(table)
        if sources:
            frame.attrs["source_values"] = tuple(sources)
        return frame
    import datasets

    if not sources:
        return datasets.Dataset(table)
    features = _with_source_names(datasets.Features.from_arrow_schema(table.schema), sources)
    return datasets.Dataset(table.cast(features.arrow_schema),
                            info=datasets.DatasetInfo(features=features))


def _with_source_names(features, sources: tuple):
    """``features`` (``datasets.Features`` of the packed schema) with ``source_ids`` a list of
    ``ClassLabel`` named by ``sources`` (the id -> value table, integers as decimal strings);
    unchanged without sources."""
    if not sources:
        return features
    import datasets

    names = [v if isinstance(v, str) else str(v) for v in sources]
    features = features.copy()
    features["source_ids"] = datasets.List(datasets.ClassLabel(names=names))
    return features
