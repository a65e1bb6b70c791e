"""Frozen, keyword-only configs; each validates itself and names the bad option."""

from __future__ import annotations

import math
import numbers
import operator
import os
import re
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction

import numpy as np

from packtool.core.packing import MAX_CAPACITY
from packtool.errors import ConfigError, LocationError
from packtool.types import (ATTENTION_MASK_COLUMN, DEFAULT_TOKEN_COLUMN, LABELS_COLUMN,
                            LOSS_MASK_COLUMNS, PACKED_COLUMNS, Engine, LabelMode, Overflow,
                            Strategy, token_column_fix)

__all__ = ["PackConfig", "CompareConfig", "TokenizeConfig", "DEFAULT_RAY_WINDOW_DOCS",
           "DEFAULT_ROW_GROUP_MB", "rows_per_group_for", "option_value"]

#: Default Parquet row-group budget in MiB of per-token data (4 bytes x C x token columns per
#: row). Chosen by measurement (docs/benchmarks.md, "Random access"): with 1 MiB one random
#: ``PackedDataset[i]`` (one row group decoded) cost 1.3 to 2.4 ms at C = 2048 and 1.8 ms at
#: C = 8192 on a lightly loaded 2-core machine, 4 MiB cost 6x that, and the output is 2 to 6 %
#: larger than with 4 MiB groups.
DEFAULT_ROW_GROUP_MB = 1.0


def rows_per_group_for(row_group_mb: float, capacity: int, token_columns: int) -> int:
    """Rows per Parquet row group that fit ``row_group_mb`` MiB of per-token int32 data.

    Args:
        row_group_mb: budget in MiB (> 0).
        capacity: C, tokens per row.
        token_columns: per-token columns stored (3, or 4 with labels).

    Returns:
        ``max(1, floor(budget / (4 * C * token_columns)))``: one row when a row alone is over
        the budget (C = 2**24 rows are 64 MiB per column).
    """
    return max(1, int(row_group_mb * 2**20) // (4 * capacity * token_columns))

#: Window used by ``--engine ray`` when ``--window-docs`` is not given (see docs/ray.md for the
#: extra rows it costs on web-like lengths).
DEFAULT_RAY_WINDOW_DOCS = 250_000


#: Fields (and arguments of ``export_nemo``) that hold a path or URI: ``os.PathLike`` values
#: are taken as their ``os.fspath``.
_PATH_FIELDS = frozenset({"inputs", "output", "holdout_output", "tokenizer", "out_dir", "dest"})

#: What each annotation of a config field takes, as messages say it.
_TAKES = {
    "int": "an integer",
    "float": "a real number",
    "bool": "True or False",
    "str": "a string",
    "tuple[str, ...]": "a list of strings",
    "int | str": "an integer token id or a token string",
}


#: Characters of a value's repr a message shows at most; a longer repr, or one of several
#: lines (a DataFrame, a Dataset, a Table), is shown as ``<package.Type>``.
SHOWN_REPR_CHARS = 60


def shown_value(value) -> str:
    """``value`` as a one-line message shows it: its repr when that is one short line
    (:data:`SHOWN_REPR_CHARS`; a string, path or number always, whole), else
    ``<package.Type>`` (``<pandas.DataFrame>``, ``<list of 3 items>``), so no error spans
    lines or quotes a whole object."""
    r = repr(value)
    if isinstance(value, (str, bytes, os.PathLike, numbers.Number)) or (
            len(r) <= SHOWN_REPR_CHARS and "\n" not in r):
        return r  # a name, a path or a number is shown whole, however long
    if isinstance(value, (list, tuple)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return f"<{type_name(value)}>"


def type_name(value) -> str:
    """The type of ``value`` with its top package (``pandas.DataFrame``, ``datasets.Dataset``,
    ``polars.DataFrame``); a builtin type bare (``list``)."""
    t = type(value)
    top = (t.__module__ or "").split(".")[0]
    return t.__name__ if top in ("", "builtins") else f"{top}.{t.__name__}"


def _bad(name, value, why, python: bool = False):
    said = (f"{name}={shown_value(value)}" if python
            else f"--{name.replace('_', '-')} {shown_value(value)}")
    raise ConfigError(f"{said}: {why}")


def _refuse(name, value, kind: str, path: bool = False, python: bool = False):
    takes = _TAKES[kind]
    if path:
        takes = "a list of paths" if kind.startswith("tuple") else "a path"
    _bad(name, value, f"must be {takes}, not {type(value).__name__}", python)


def option_value(name: str, value, kind: str, *, minimum: int | None = None,
                 python: bool = False):
    """``value`` of the option ``name`` checked against ``kind`` (a config field's annotation:
    ``int``, ``float``, ``bool``, ``str``, ``tuple[str, ...]``, ``int | str``, each optionally
    ``| None``) and returned as the plain Python value every config holds.

    The one type check of every option, shared by the configs (each field by its annotation)
    and the Python API's own arguments, so ``packtool.pack`` takes what ``packtool pack``
    takes and nothing is cut silently:

    - ``int``: anything with ``__index__`` (``int``, NumPy integers) as the equal ``int``;
      ``bool`` (``True`` is not a capacity), floats (``1.5``, and ``8.0`` alike) and strings
      are refused;
    - ``float``: a real number other than ``bool`` (NumPy floats, ``Fraction``), kept as the
      ``float`` of the decimal it prints as (a NumPy float32 0.3 is 0.3);
    - ``bool``: ``True``/``False`` or a NumPy bool; ``"no"``, ``0`` and ``None`` are refused;
    - ``str``: a string; a path field (``inputs``, ``output``, ``holdout_output``,
      ``tokenizer``) also takes an ``os.PathLike``; ``tuple[str, ...]``: a list or tuple of
      those, never one bare string.

    Args:
        name: the option (``batch_rows``; messages name it ``--batch-rows``).
        value: what was given.
        kind: the annotation it must match.
        minimum: an ``int`` below it is refused too.
        python: name it as the keyword of a Python function that is no command's
            (``eos_id=True: ...``), not as its flag (``--eos-id True: ...``, which
            :func:`packtool.api.pack` words as its keyword in turn).

    Raises:
        ConfigError: ``--NAME VALUE: must be WHAT, not TYPE`` (or ``must be >= MINIMUM``;
            ``python``: ``NAME=VALUE: ...``).
    """
    kind = kind.replace(" ", "")
    if kind.endswith("|None"):
        if value is None:
            return None
        kind = kind[: -len("|None")]
    kind = {"tuple[str,...]": "tuple[str, ...]", "int|str": "int | str"}.get(kind, kind)
    path = name in _PATH_FIELDS
    if kind == "int" or (kind == "int | str" and not isinstance(value, str)):
        if isinstance(value, bool):  # True is 1 to operator.index, not a capacity
            _refuse(name, value, kind, python=python)
        try:
            value = operator.index(value)
        except TypeError:  # a float, a string, a NumPy bool
            _refuse(name, value, kind, python=python)
        if minimum is not None and value < minimum:
            _bad(name, value, f"must be >= {minimum}", python)
        return value
    if kind in ("str", "int | str"):
        if path and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            _refuse(name, value, kind, path, python)
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            _refuse(name, value, kind, python=python)
        f = float(value)
        try:
            return float(Fraction(str(value))) if math.isfinite(f) else f
        except ValueError:  # a Real whose str is no decimal
            return f
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            _refuse(name, value, kind, python=python)
        return bool(value)
    if kind == "tuple[str, ...]":
        if not isinstance(value, (list, tuple)):
            _refuse(name, value, kind, path, python)
        return tuple(option_value(name, v, "str", python=python) for v in value)
    raise TypeError(f"option {name}: no check for the annotation {kind!r}")  # a new field


#: Choice fields: checked by converting to their enum (``choose one of ...``).
_ENUMS = frozenset({"Strategy", "Overflow", "LabelMode", "Engine"})


def _check_types(cfg) -> None:
    """Every field of ``cfg`` through :func:`option_value` by its annotation (the enums by
    their own conversion), replaced by the plain value: so a NumPy integer is recorded as the
    equal ``int`` and a manifest holds JSON values."""
    for f in fields(cfg):
        if f.type in _ENUMS:
            continue
        object.__setattr__(cfg, f.name, option_value(f.name, getattr(cfg, f.name), f.type))


def _check_locations(cfg) -> None:
    """Every INPUT and OUTPUT of ``cfg`` read as a location (:meth:`Location.parse`), so that a
    name that is none (an empty path, a ``file:`` URI of another host or of no absolute path)
    is refused before any work: :class:`~packtool.errors.LocationError`."""
    from packtool.location import Location

    for name in ("inputs", "output", "holdout_output"):
        value = getattr(cfg, name, None)
        for given in (value if isinstance(value, tuple) else () if value is None else (value,)):
            Location.parse(given)


def _check_input_options(cfg, bad) -> None:
    """The checks shared by every config that reads INPUT (mask columns, BOS/EOS, capacity);
    ``none`` as a mask column name becomes None."""
    if not cfg.inputs:
        raise ConfigError("give at least one INPUT")
    if not 2 <= cfg.capacity <= MAX_CAPACITY:
        bad("capacity", cfg.capacity, f"must be in 2..{MAX_CAPACITY} tokens")
    if cfg.append_eos is not None and not 0 <= cfg.append_eos < 2**31:
        bad("append_eos", cfg.append_eos, "must be a token id in 0..2**31-1")
    if cfg.prepend_bos is not None and not 0 <= cfg.prepend_bos < 2**31:
        bad("prepend_bos", cfg.prepend_bos, "must be a token id in 0..2**31-1")
    for name in ("attention_mask_column", "labels_column", "loss_mask_column"):
        value = getattr(cfg, name)
        if value is not None and value.lower() == "none":
            object.__setattr__(cfg, name, None)
        elif value is not None and value == cfg.column:
            bad(name, value, f"is the token column (--column {cfg.column}); "
                f"{token_column_fix('--' + name.replace('_', '-'), cfg.column)}")


def _read_options(cfg) -> dict:
    opts = {"attention_mask": cfg.attention_mask_column, "labels": cfg.labels_column,
            "loss_mask": cfg.loss_mask_column, "bos": cfg.prepend_bos, "eos": cfg.append_eos}
    if getattr(cfg, "source_column", None) is not None:
        opts["source"] = cfg.source_column
    return opts


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    """Everything ``packtool pack`` needs."""

    inputs: tuple[str, ...]
    """INPUT paths: Parquet files or directories (searched recursively)."""
    output: str
    """OUTPUT directory."""
    capacity: int = 2048
    """Tokens per packed row (C), 2..2**24."""
    column: str = DEFAULT_TOKEN_COLUMN
    """Token column of the input (a list of integers)."""
    strategy: Strategy = Strategy.OBFD
    """Packing strategy."""
    overflow: Overflow = Overflow.SPLIT
    """Policy for documents longer than the capacity."""
    segment_multiple: int = 1
    """N: every document piece takes a multiple of N slots of its row, its tokens then padding
    (context parallelism: TransformerEngine's THD format splits each sequence into 2 x cp
    pieces, so N = 2 x cp). ``capacity`` must be a multiple of N."""
    min_fill: float = 0.0
    """F in [0, 1]: planned rows holding fewer than ``ceil(F * capacity)`` real tokens are not
    written (their documents and tokens counted as dropped); 0 keeps every row, 1 keeps only
    rows without padding (:func:`packtool.core.packing.drop_underfilled`)."""
    labels: LabelMode = LabelMode.NONE
    """Labels column written: ``none`` (default: not stored, readers derive the unshifted labels
    from input_ids and segment_ids), ``unshifted`` or ``shifted``."""
    pad_id: int = 0
    """Token id written on padding (0..2**31-1)."""
    append_eos: int | None = None
    """If set, this id is appended to every non-empty document not already ending with it."""
    prepend_bos: int | None = None
    """If set, this id is prepended to every non-empty document not already starting with it."""
    attention_mask_column: str | None = "auto"
    """Input column whose 0 entries mark tokens to remove before packing (padding of a padded
    tokenization, at a row's ends: a row with a 0 between two 1s is refused); ``"auto"``:
    ``attention_mask`` when a file has it; None: ignore."""
    labels_column: str | None = "auto"
    """Input column of unshifted labels whose -100 entries stay non-targets after packing (SFT
    prompt masking); ``"auto"``: ``labels`` when a file has it; None: ignore. When such a
    column is read, the packed labels carry real information and are stored (unshifted when
    ``labels`` is ``none``)."""
    loss_mask_column: str | None = "auto"
    """Input loss mask (1 = a token to learn, 0 = not a target), TRL's SFT columns; ``"auto"``:
    ``completion_mask`` and ``assistant_masks``, each when a file has it; None: ignore. A token
    is a target only when its label (if read) is not -100 and every loss mask read is 1."""
    seed: int = 0
    """Seed of the output row shuffle."""
    shuffle: bool = True
    """Shuffle output rows (False keeps creation order)."""
    rows_per_shard: int = 8192
    """Rows per output shard."""
    row_group_mb: float = DEFAULT_ROW_GROUP_MB
    """Parquet row-group budget in MiB of per-token data; decides ``rows_per_group``."""
    compression: str = "zstd"
    """Parquet codec of the shards: ``zstd`` (level 3, the smallest) or ``lz4`` (about 45 %
    more bytes for ``input_ids``, about 0.6x the CPU for a loader to decode them)."""
    rows_per_group: int | None = None
    """Rows per Parquet row group (bounds memory per worker and the cost of one random row);
    None: from ``row_group_mb`` (:func:`rows_per_group_for`)."""
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Threads laying out and encoding shards."""
    overwrite: bool = False
    """Replace an existing non-empty OUTPUT."""
    window_docs: int | None = None
    """Plan and write windows of about this many documents independently (None: one global
    plan). Decides the output bytes; see :mod:`packtool.pipeline.read`."""
    engine: Engine = Engine.LOCAL
    """Where the pack runs; ``ray`` needs a window (defaults to DEFAULT_RAY_WINDOW_DOCS)."""
    ray_address: str | None = None
    """Ray cluster to join (``--engine ray``); None starts a local Ray on ``workers`` CPUs."""
    skip_unsupported: bool = False
    """Skip files of an unsupported format inside an INPUT directory (reported) instead of
    refusing them."""
    holdout: float | None = None
    """Fraction of documents held out (0 < f < 1), each drawn independently from ``seed``
    (:mod:`packtool.core.holdout`), packed into ``holdout_output`` and left out of ``output``;
    None: no split."""
    holdout_output: str | None = None
    """Where the held-out documents are packed (default: ``OUTPUT-holdout`` beside OUTPUT)."""
    holdout_part: str | None = None
    """Set by the driver for each of the two packs of a split: ``train`` (the documents not
    held out) or ``holdout``; None with ``holdout`` set: pack both."""
    source_column: str | None = None
    """Input column (a string or integer per document: source, lang, a URL's domain) carried
    into the packed rows as each segment's ``source_ids``, its id -> value table in the
    manifest; None: not carried."""
    inputs_digest: str | None = None
    """sha256 (64 hex characters) of the inputs' content, where the caller knows it (the
    Python API's temporary file of in-memory documents): the output's fingerprint records it
    instead of the input files' paths, sizes and times, so a rerun on the same documents finds
    its finished (or interrupted) output. None: the files as found."""
    inputs_name: str | None = None
    """How the manifest names the input in place of its path, where that path means nothing
    after the pack (the Python API's temporary file of in-memory documents, removed once
    packed); None: each file's path."""

    def __post_init__(self) -> None:
        bad = _bad
        _check_types(self)  # first: the checks below compare plain ints, floats and strings
        _check_locations(self)
        if self.inputs_digest is not None and not re.fullmatch(r"[0-9a-f]{64}",
                                                               self.inputs_digest):
            bad("inputs_digest", self.inputs_digest, "must be a sha256 in 64 hex characters")
        if self.source_column is not None:
            if not self.source_column:
                bad("source_column", self.source_column, "give a column name")
            if self.source_column == self.column:
                bad("source_column", self.source_column, f"is the token column (--column "
                    f"{self.column}); {token_column_fix('--source-column', self.column)}")
        for name, enum in (("strategy", Strategy), ("overflow", Overflow), ("labels", LabelMode),
                           ("engine", Engine)):
            try:
                object.__setattr__(self, name, enum(getattr(self, name)))
            except ValueError:
                bad(name, getattr(self, name), f"choose one of {', '.join(e.value for e in enum)}")
        _check_segment_multiple(self, bad)
        if not 0 <= self.pad_id < 2**31:
            # a negative id would index an embedding table out of range
            bad("pad_id", self.pad_id, "must be a token id in 0..2**31-1 (int32, not negative)")
        _check_input_options(self, bad)
        if self.rows_per_shard < 1:
            bad("rows_per_shard", self.rows_per_shard, "must be >= 1")
        if not 0 < self.row_group_mb < float("inf"):
            bad("row_group_mb", self.row_group_mb, "must be a finite number > 0 MiB")
        if self.compression not in ("zstd", "lz4"):
            bad("compression", self.compression, "choose zstd or lz4")
        _check_min_fill(self, bad)
        if self.rows_per_group is None:
            ncols = 3 if self.labels is LabelMode.NONE else 4
            object.__setattr__(self, "rows_per_group",
                               rows_per_group_for(self.row_group_mb, self.capacity, ncols))
        if self.rows_per_group < 1:
            bad("rows_per_group", self.rows_per_group, "must be >= 1")
        if self.workers < 1:
            bad("workers", self.workers, "must be >= 1")
        if not 0 <= self.seed < 2**63:
            bad("seed", self.seed, "must be in 0..2**63-1")
        if self.window_docs is not None and self.window_docs < 1:
            bad("window_docs", self.window_docs, "must be >= 1 documents")
        if self.ray_address is not None and self.engine is not Engine.RAY:
            bad("ray_address", self.ray_address, "only applies with --engine ray")
        if self.engine is Engine.RAY and self.window_docs is None:
            object.__setattr__(self, "window_docs", DEFAULT_RAY_WINDOW_DOCS)
        self._check_holdout(bad)

    def _check_holdout(self, bad) -> None:
        if self.holdout is None:
            if self.holdout_output is not None or self.holdout_part is not None:
                bad("holdout_output", self.holdout_output, "needs --holdout FRACTION")
            return
        if not 0.0 < self.holdout < 1.0:
            bad("holdout", self.holdout, "must be a fraction of the documents, 0 < f < 1")
        if self.holdout_part not in (None, "train", "holdout"):
            bad("holdout_part", self.holdout_part, "choose train or holdout")
        from packtool.location import Location

        out = Location.parse(self.output)
        if self.holdout_output is None:  # OUTPUT-holdout beside OUTPUT, same store options
            try:  # named from the folder OUTPUT names: "." is the working folder
                held = out.beside("-holdout")
            except LocationError:
                what = ("is the filesystem root" if out.is_local else "is a whole bucket")
                bad("holdout", self.holdout, f"OUTPUT {out.display} {what}; give "
                    "--holdout-output LOCATION")
            object.__setattr__(self, "holdout_output", str(held))
        if self.holdout_part is not None:  # one of the two packs: its OUTPUT is set
            return
        if out.overlaps(Location.parse(self.holdout_output)):
            bad("holdout_output", self.holdout_output, f"overlaps OUTPUT {self.output}; choose a "
                "directory beside it")

    def holdout_split(self):
        """The documents this pack keeps (:class:`packtool.core.holdout.HoldoutSplit`), or None
        when it keeps every document."""
        if self.holdout is None or self.holdout_part is None:
            return None
        from packtool.core.holdout import HoldoutSplit

        return HoldoutSplit(self.holdout, self.seed, self.holdout_part == "holdout")

    def read_options(self) -> dict:
        """Keyword arguments of :func:`packtool.pipeline.read.iter_documents`: the mask
        columns and BOS/EOS."""
        return _read_options(self)

    def to_dict(self) -> dict:
        """The options as JSON-ready values (what the manifest records)."""
        d = asdict(self)
        d["inputs"] = list(self.inputs)
        for k in ("strategy", "overflow", "labels", "engine"):
            d[k] = d[k].value
        return d

    def own_outputs(self) -> tuple[tuple[str, str], ...]:
        """``(path, how messages name it)`` of each output this pack writes: OUTPUT, and the
        held-out output with ``holdout``; input discovery refuses a link to one of them."""
        held = ((self.holdout_output, "--holdout-output"),) if self.holdout_output else ()
        return ((self.output, "OUTPUT"),) + held

    def layout_options(self) -> dict:
        """The options that decide the output bytes (workers, overwrite and the engine do not;
        ``window_docs`` is listed only when set, so one-plan manifests keep their old form)."""
        d = self.to_dict()
        for k in ("inputs", "output", "workers", "overwrite", "engine", "ray_address",
                  "holdout_output", "inputs_digest", "inputs_name",
                  "skip_unsupported"):  # which files are read is in the fingerprint's file list
            d.pop(k)
        for k in ("window_docs", "holdout", "holdout_part", "source_column"):
            if d[k] is None:  # listed only when set: older manifests keep their form
                d.pop(k)
        if d["segment_multiple"] == 1:  # plain packs keep their manifest and fingerprint
            d.pop("segment_multiple")
        if d["compression"] == "zstd":  # listed only when not the default, likewise
            d.pop("compression")
        if not d["min_fill"]:
            d.pop("min_fill")
        return d


def _check_segment_multiple(cfg, bad) -> None:
    """Refuse a ``segment_multiple`` under 1 or that ``capacity`` is not a multiple of (``bad``
    raises, naming the capacities that would do)."""
    if cfg.segment_multiple < 1:
        bad("segment_multiple", cfg.segment_multiple, "must be an integer >= 1")
    if cfg.capacity % cfg.segment_multiple:
        n = cfg.segment_multiple
        lo, hi = cfg.capacity // n * n, -(-cfg.capacity // n) * n
        bad("segment_multiple", n, f"--capacity {cfg.capacity} is not a multiple of it; "
            "every padded document and the padding tail must be multiples of N: use "
            "--capacity " + (f"{lo} or {hi}" if lo >= 2 else f"{hi}"))


def _check_min_fill(cfg, bad) -> None:
    """Refuse a ``min_fill`` outside [0, 1] (``bad`` raises); :func:`option_value` has made it
    the float of the number it prints as (a NumPy float32 0.3 is 0.3, a Fraction 1/2 is 0.5)."""
    if not 0 <= cfg.min_fill <= 1:
        bad("min_fill", cfg.min_fill, "must be a fraction of the capacity in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class CompareConfig:
    """Everything ``packtool compare`` needs: INPUT read exactly as ``pack`` reads it (the same
    mask columns and BOS/EOS, through the same code path), and the dry run's capacity."""

    inputs: tuple[str, ...]
    """INPUT paths or URIs: files or directories (searched recursively)."""
    capacity: int
    """Tokens per row of the dry run (C), 2..2**24."""
    column: str = DEFAULT_TOKEN_COLUMN
    """Token column of the input."""
    overflow: Overflow = Overflow.SPLIT
    """Policy for documents longer than the capacity (``ordered`` and ``obfd``)."""
    append_eos: int | None = None
    """As :attr:`PackConfig.append_eos`."""
    prepend_bos: int | None = None
    """As :attr:`PackConfig.prepend_bos`."""
    attention_mask_column: str | None = "auto"
    """As :attr:`PackConfig.attention_mask_column`."""
    labels_column: str | None = "auto"
    """As :attr:`PackConfig.labels_column`."""
    loss_mask_column: str | None = "auto"
    """As :attr:`PackConfig.loss_mask_column`."""
    skip_unsupported: bool = False
    """As :attr:`PackConfig.skip_unsupported`."""
    window_docs: int | None = None
    """Also dry-run every strategy in windows of this many documents, dealt and planned as
    ``pack --strategy S --window-docs`` deals and plans them; None: one global plan only."""
    min_fill: float = 0.0
    """As :attr:`PackConfig.min_fill`: each plan without its rows under the fill fraction."""
    segment_multiple: int = 1
    """As :attr:`PackConfig.segment_multiple`: every document piece planned to take a multiple
    of N slots of its row (``capacity`` must be a multiple of N)."""

    def __post_init__(self) -> None:
        _check_types(self)
        if self.window_docs is not None and self.window_docs < 1:
            _bad("window_docs", self.window_docs, "must be >= 1")
        _check_min_fill(self, _bad)
        _check_segment_multiple(self, _bad)
        try:
            object.__setattr__(self, "overflow", Overflow(self.overflow))
        except ValueError:
            _bad("overflow", self.overflow, f"choose one of {', '.join(e.value for e in Overflow)}")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        _check_locations(self)
        _check_input_options(self, _bad)

    def read_options(self) -> dict:
        """Keyword arguments of :func:`packtool.pipeline.read.iter_documents` (the same as
        :meth:`PackConfig.read_options` for the same options)."""
        return _read_options(self)


def _read_by_pack(name: str) -> str:
    """Why ``packtool pack`` cannot take a column named ``name`` kept beside tokenized
    documents, in words (it reads such a column by its name under its default options: a
    per-token mask, or a column of packed rows); empty for any other name."""
    mask = {ATTENTION_MASK_COLUMN: ("attention mask", "--attention-mask-column"),
            LABELS_COLUMN: ("labels", "--labels-column"),
            **{n: ("loss mask", "--loss-mask-column") for n in LOSS_MASK_COLUMNS}}
    if name in mask:
        what, option = mask[name]
        return (f"pack reads a column so named as the tokens' {what} ({option} auto), and one "
                "carried from the text holds no value per token of the new input_ids")
    if name in PACKED_COLUMNS:
        return "pack takes a column so named for one of packed rows and would refuse the shards"
    return ""


@dataclass(frozen=True, kw_only=True)
class TokenizeConfig:
    """Everything ``packtool tokenize`` needs."""

    inputs: tuple[str, ...]
    """INPUT paths or URIs: Parquet, Arrow IPC, save_to_disk folders, JSON Lines."""
    output: str
    """OUTPUT directory (or URI) of tokenized Parquet shards."""
    tokenizer: str
    """Local tokenizer file: tokenizers JSON, Tekken JSON or tiktoken BPE file; or a folder
    holding exactly one ``tokenizer.json`` or ``tekken.json``."""
    text_column: str = "text"
    """Text column (JSON Lines: the key)."""
    keep_columns: tuple[str, ...] = ()
    """Columns (JSON Lines: keys) carried from the text input into the tokenized shards beside
    ``input_ids`` (for ``pack --source-column``, ids, URLs)."""
    append_eos: int | str | None = None
    """End-of-document token (id or special token string) appended to every non-empty
    document not already ending with it."""
    prepend_bos: int | str | None = None
    """Beginning-of-document token (id or string) prepended likewise."""
    add_special_tokens: bool = False
    """tokenizers JSON only: run the tokenizer's post-processor (its template's BOS/EOS)."""
    tokenizer_pattern: str | None = None
    """Pre-tokenisation regex of a tiktoken BPE file not named after a tiktoken encoding."""
    batch_docs: int = 1024
    """Documents encoded (and written as one Parquet row group) at a time."""
    rows_per_shard: int = 100_000
    """Documents per output shard (each input file starts a new shard): the unit of resume."""
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Encoding threads, for every tokenizer kind (a tokenizer.json too: packtool's threads)."""
    overwrite: bool = False
    """Replace a non-empty OUTPUT."""
    skip_unsupported: bool = False
    """As :attr:`PackConfig.skip_unsupported`."""

    def __post_init__(self) -> None:
        _check_types(self)
        if not self.inputs:
            raise ConfigError("give at least one INPUT")
        _check_locations(self)
        object.__setattr__(self, "keep_columns", tuple(self.keep_columns))
        for name in self.keep_columns:
            if name == self.text_column:
                _bad("keep_column", name, "the text column, whose tokens are input_ids; "
                     "keep other columns")
            if name == "input_ids":
                _bad("keep_column", name, "the column of the tokens written; keep other "
                     "columns")
            why = _read_by_pack(name)
            if why:
                _bad("keep_column", name, f"{why}; rename it in the text input (say "
                     f"{name + '_text'!r}) or leave it out")
            if self.keep_columns.count(name) > 1:
                _bad("keep_column", name, f"given {self.keep_columns.count(name)} times; "
                     "give each column once")
        for name in ("batch_docs", "rows_per_shard", "workers"):
            if getattr(self, name) < 1:
                _bad(name, getattr(self, name), "must be >= 1")

    def layout_options(self) -> dict:
        """The options that decide the output bytes (the tokenizer by its file's sha256 is
        added by the driver; which files are read is in the fingerprint's file list)."""
        d = asdict(self)
        for k in ("inputs", "output", "workers", "overwrite", "tokenizer", "skip_unsupported"):
            d.pop(k)
        return d
