"""The sources of a training dataset: one packed output, or several mixed by weight (no torch).

A :class:`Mixture` opens each output through the one reader
(:class:`~packtool.formats.packed.PackedOutput`), checks that they can be mixed (same capacity,
the same columns handed out), turns the weights into each source's exact rows per epoch
(:func:`packtool.loader.plan.apportion`) and maps the plan's row keys back to (source, row).
Changing the weights changes only these shares: no output is repacked.

Source names are what items and batches carry (``source``); a single output is one source named
after its directory (``packed/`` -> ``packed``). Per-token source ids of outputs packed with
``--source-column`` are renumbered into one table over all sources (:attr:`source_values`), so
an id means the same value whichever output a row came from.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Mapping, Sequence

import numpy as np

from packtool.errors import ManifestError
from packtool.loader.plan import EpochOrder, apportion
from packtool.loader.source import check_label_masks, open_source

__all__ = ["Mixture"]


def _salt(name: str) -> int:
    """A stable 63-bit number of a source name (seeds its passes, independent of the order in
    which sources are listed)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") >> 1


def _content(output) -> str:
    """16 hex digits naming the rows of a packed output: its shards' sha256s in row order."""
    h = hashlib.sha256()
    for shard in output.manifest.shards:
        h.update(shard.sha256.encode())
    return h.hexdigest()[:16]


class Mixture:
    """One or more packed outputs and each one's rows per epoch.

    Args:
        sources: a packed output (path, ``file:`` or store URI, or an open
            :class:`~packtool.formats.packed.PackedOutput`), or a mapping name -> output.
        weights: name -> non-negative weight (any scale; at least one positive), the share of
            each source in every epoch (weight 0: none); None: every row of every source once
            per epoch.
        rows_per_epoch: rows of an epoch over all sources (default: the rows of the sources
            with a positive weight, of every source without ``weights``, so weights in the
            ratio of the sources' rows read every row once an epoch); without ``weights`` they
            are shared in proportion to the sources' rows.
        labels: the labels convention items carry (None: the outputs' own, which must agree).
        columns: columns handed out (None: every column of the outputs, which must agree).
        open_kw: passed to :func:`packtool.loader.source.open_source` for each output.

    Attributes:
        names: source names, in the order given.
        outputs: their :class:`~packtool.formats.packed.PackedOutput`.
        shares: int64[S], rows of each source per epoch (sum: :attr:`rows_per_epoch`).
        labels_mode: the convention items carry.
        columns: the columns items carry.
        capacity: C.

    Warns:
        UserWarning: without ``weights``, a source that holds no rows (naming it; every epoch
            is empty when none holds a row).

    Raises:
        ValueError: no source, a list of outputs (a mixture is a dict), one output under two
            names (a trailing slash, a relative and an absolute path, a link, a store URI with
            its options in another order name the same one), a bad name or weight, weights for
            other sources than given, a source with a positive weight and no rows, a
            non-positive ``rows_per_epoch``, or ``labels=None`` with outputs of different
            conventions.
        ManifestError: an output that cannot be opened, outputs of different capacity or
            columns, or a requested column some output lacks. (Outputs whose manifests record
            different tokenizers, and copies of one output, are named in a warning.)
    """

    def __init__(self, sources, *, weights: Mapping[str, float] | None = None,
                 rows_per_epoch: int | None = None, labels: str | None = "unshifted",
                 columns: Sequence[str] | None = None, **open_kw) -> None:
        if isinstance(sources, Mapping):
            items = list(sources.items())
            if not items:
                raise ValueError("give at least one source")
            for name, _ in items:
                if not isinstance(name, str) or not name:
                    raise ValueError(f"source names are non-empty strings, got {name!r}")
        elif isinstance(sources, (list, tuple, set)):
            raise ValueError(f"a list of {len(sources)} outputs: give a mixture as a dict "
                             "{name: path} (its weights as weights={name: weight}), or one "
                             "output as a path or store URI")
        else:
            items = [(None, sources)]
        names, outputs, modes = [], [], []
        for name, path in items:
            out, mode = open_source(path, labels, **open_kw)
            names.append(name if name is not None else (out.location.name or "output"))
            outputs.append(out)
            modes.append(mode)
        self.names = tuple(names)
        self.outputs = tuple(outputs)
        self._distinct()
        if len(set(modes)) > 1:
            raise ValueError(
                "the outputs hand out different labels conventions ("
                + ", ".join(f"{n}: {m}" for n, m in zip(names, modes))
                + "); pass labels='unshifted' or labels='shifted'")
        self.labels_mode = modes[0]
        self.capacity = self._same_capacity()
        self._same_tokenizer()
        self.columns = self._columns(columns)
        sizes = np.asarray([o.num_rows for o in outputs], dtype=np.int64)  # shape: (S,)
        self.rows = sizes
        self.weights = self._weights(weights)
        if rows_per_epoch is not None:
            if isinstance(rows_per_epoch, bool) or int(rows_per_epoch) != rows_per_epoch \
                    or rows_per_epoch < 1:
                raise ValueError(f"rows_per_epoch must be a positive integer, got "
                                 f"{rows_per_epoch!r}")
            total = int(rows_per_epoch)
        elif self.weights is None:
            total = int(sizes.sum())
        else:  # the sources that give rows: a source of weight 0 counts none
            total = int(sum(int(n) for name, n in zip(self.names, sizes)
                            if self.weights[name] > 0))
        if self.weights is None:
            if rows_per_epoch is not None and not sizes.sum():
                raise ValueError(f"rows_per_epoch={total}, but the outputs hold no rows "
                                 f"({self.describe_rows()}); pack some first")
            if rows_per_epoch is not None and total != int(sizes.sum()):
                self.shares = apportion([int(n) for n in sizes], total)
            else:
                self.shares = sizes.copy()
        else:
            self.shares = apportion([self.weights[n] for n in self.names], total)
        self._check_empty()
        self._warn_copies()
        self.rows_per_epoch = int(self.shares.sum())
        self.salts = None if len(self.names) == 1 else [_salt(n) for n in self.names]
        self.row_base = np.zeros(len(outputs) + 1, dtype=np.int64)  # shape: (S + 1,)
        np.cumsum(sizes, out=self.row_base[1:])
        self.group_base = np.zeros(len(outputs) + 1, dtype=np.int64)  # shape: (S + 1,)
        np.cumsum([o.num_row_groups for o in outputs], out=self.group_base[1:])
        self.source_values, self._source_maps = self._source_table()

    # --- checks -----------------------------------------------------------------------------

    def _same_capacity(self) -> int:
        caps = {o.capacity for o in self.outputs}
        if len(caps) > 1:
            raise ManifestError("outputs of different capacity cannot be mixed ("
                                + ", ".join(f"{n}: {o.capacity}" for n, o
                                            in zip(self.names, self.outputs))
                                + "); pack them at one --capacity")
        return caps.pop()

    def _same_tokenizer(self) -> None:
        """Warn of outputs whose manifests record different tokenizers (by kind and sha256 of
        the tokenizer file, :meth:`~packtool.formats.manifest.TokenizerInfo.same_ids`): id 1000
        is then most likely one token in one and another in the other, so a model would learn
        both as one. A warning, as ``pack`` gives for its inputs, not a refusal: two files of
        another sha256 may hold the same ids (a ``tokenizer.json`` saved again), which nothing
        here can tell. An output that records none (packed from plain Parquet, or from tokenize
        outputs of different tokenizers) is not compared: nothing says its tokenizer."""
        first = None  # (name, tokenizer) of the first output that records one
        for name, o in zip(self.names, self.outputs):
            record = getattr(o.manifest, "tokenized", None)
            if record is None:
                continue
            if first is None:
                first = (name, record.tokenizer)
            elif not first[1].same_ids(record.tokenizer):
                warnings.warn(
                    f"outputs {first[0]!r} and {name!r} hold the ids of different tokenizers "
                    f"({first[0]}: {first[1].describe()}; {name}: "
                    f"{record.tokenizer.describe()}), so an id most likely means another token "
                    "in each; unless the two files hold the same vocabulary, tokenize their "
                    "text with one tokenizer (packtool tokenize --tokenizer FILE) and pack it "
                    "again", stacklevel=4)
                return

    def _columns(self, columns) -> list[str]:
        if columns is not None:
            cols = None
            for o in self.outputs:
                cols = o.check_columns(columns)  # ManifestError names the output and column
                check_label_masks(o, cols)
            return cols
        first = self.outputs[0].default_columns()
        for name, o in zip(self.names[1:], self.outputs[1:]):
            other = o.default_columns()
            if other != first:
                diff = sorted(set(first) ^ set(other))
                raise ManifestError(
                    f"outputs {self.names[0]!r} and {name!r} hold different columns "
                    f"({', '.join(diff)} in one only); pass columns=[...] that both hold, "
                    "or repack them with the same options")
        return first

    def _distinct(self) -> None:
        """Refuse one output given under two names (every row would come twice an epoch).

        Raises:
            ValueError: names both sources, the output and the fix.
        """
        seen: dict = {}
        for name, o in zip(self.names, self.outputs):
            key = o.location.identity()
            if key in seen:
                raise ValueError(
                    f"sources {seen[key]!r} and {name!r} are the same output "
                    f"({o.location.display}), so each of its rows would come twice an epoch: "
                    "give it once, under one name, and a larger weight to read it more")
            seen[key] = name

    def _warn_copies(self) -> None:
        """Warn of two copies of one output that both give rows to the epoch (the same shards,
        by their sha256 in the manifests: a copy in a store beside the local one, or the same
        input packed twice with the same options): their rows come twice an epoch, though a
        copy may be mixed on purpose. A copy of weight 0 gives none, and is not named."""
        copies: dict = {}
        for name, o, share in zip(self.names, self.outputs, self.shares):
            if not share:
                continue
            shards = o.manifest.shards
            if not shards or not all(s.sha256 for s in shards):
                continue
            content = tuple(s.sha256 for s in shards)
            if content in copies:
                first, where = copies[content]
                warnings.warn(
                    f"sources {first!r} ({where}) and {name!r} ({o.location.display}) hold the "
                    f"same rows (their {len(shards)} "
                    f"{'shard has' if len(shards) == 1 else 'shards have'} the same sha256: "
                    "copies of "
                    "one output), so each row comes twice an epoch; unless that is meant, give "
                    "one of them, under one name, and a larger weight to read it more",
                    stacklevel=4)
            copies.setdefault(content, (name, o.location.display))

    def _check_empty(self) -> None:
        """A source that holds no rows: refused when it has a positive weight (it cannot give
        its share, whatever the rows per epoch); without weights, a warning naming it (it gives
        nothing to any epoch, and the epoch is empty when no source holds a row). A source of
        weight 0 is left out on purpose.

        Raises:
            ValueError: a source with a positive weight and no rows.
        """
        empty = [(n, o) for n, o, r in zip(self.names, self.outputs, self.rows) if r == 0]
        if self.weights is not None:
            empty = [(n, o) for n, o in empty if self.weights[n] > 0]
            if empty:
                n, o = empty[0]
                raise ValueError(f"source {n!r} ({o.location.display}) holds no rows but has "
                                 f"weight {self.weights[n]!r}; give it weight 0 or remove it")
            return
        if empty:
            one = len(empty) == 1
            it = "it" if one else "them"
            if len(empty) == len(self.names):
                then = f"every epoch is empty; pack rows into {it}"
            else:
                then = (f"{'it gives' if one else 'they give'} none to any epoch; pack rows into "
                        f"{it}, or leave {it} out")
            what = ", ".join(f"{n!r} ({o.location.display})" for n, o in empty)
            warnings.warn(f"source{'' if one else 's'} {what} hold{'s' if one else ''} no rows: "
                          f"{then}", stacklevel=4)

    def _weights(self, weights):
        if weights is None:
            return None
        if not isinstance(weights, Mapping):
            raise ValueError(f"weights must map source names to numbers, got {weights!r}")
        missing = [n for n in self.names if n not in weights]
        extra = [n for n in weights if n not in self.names]
        if missing or extra:
            raise ValueError(f"weights name other sources than given (missing: {missing}, "
                             f"unknown: {extra}); sources: {list(self.names)}")
        w = {n: weights[n] for n in self.names}
        apportion([w[n] for n in self.names], 0, self.names)  # validates, naming the source
        return w

    def _source_table(self):
        """One id -> value table over every output packed with ``--source-column``, and each
        output's map from its ids to that table's (None for an output without the column)."""
        values: list = []
        index: dict = {}
        maps = []
        for o in self.outputs:
            table = tuple(getattr(o.manifest, "source_values", ()) or ())
            if not table:
                maps.append(None)
                continue
            m = np.empty(len(table), dtype=np.int32)  # shape: (ids of this output,)
            for i, v in enumerate(table):
                key = (type(v).__name__, v)
                if key not in index:
                    index[key] = len(values)
                    values.append(v)
                m[i] = index[key]
            maps.append(m)
        return tuple(values), maps

    # --- the plan's view --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.names)

    def order(self, *, seed: int, epoch: int, shuffle: bool) -> EpochOrder:
        """The epoch's sequence of row keys (:class:`~packtool.loader.plan.EpochOrder`)."""
        return EpochOrder([o.rg_rows for o in self.outputs], self.shares, seed=seed,
                          epoch=epoch, shuffle=shuffle, salts=self.salts)

    def locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source int64[n], row in that source int64[n], row group over all sources
        int64[n]) of row keys ``keys``."""
        keys = np.asarray(keys, dtype=np.int64)
        src = np.searchsorted(self.row_base, keys, side="right") - 1
        local = keys - self.row_base[src]
        group = np.empty(keys.size, dtype=np.int64)
        for s, o in enumerate(self.outputs):
            sel = src == s
            if sel.any():
                group[sel] = self.group_base[s] + o.group_of(local[sel])
        return src, local, group

    def split_group(self, group: int) -> tuple[int, int]:
        """(source, row group of that source) of a row group over all sources."""
        s = int(np.searchsorted(self.group_base, group, side="right") - 1)
        return s, int(group - self.group_base[s])

    def remap_sources(self, s: int, block) -> None:
        """Renumber ``block``'s per-segment ``source_ids`` (in place) into
        :attr:`source_values`' ids."""
        m = self._source_maps[s]
        if m is not None and "source_ids" in block.ragged:
            vals, offs = block.ragged["source_ids"]
            block.ragged["source_ids"] = (m[vals], offs)

    def fingerprint(self) -> dict:
        """What a mid-epoch state must match: each source's name and rows, and its share
        (``sources``), and which rows each source holds (``content``: 16 hex digits of the
        sha256 of its shards' sha256s in row order, so an output repacked differently, or
        another output of the same name and rows, is told apart; the same rows packed again
        byte for byte, moved or copied, match)."""
        return {"sources": [[n, int(r), int(c)] for n, r, c
                            in zip(self.names, self.rows, self.shares)],
                "content": [_content(o) for o in self.outputs]}

    def describe_rows(self) -> str:
        """``name: rows`` of every source, for messages."""
        return ", ".join(f"{n}: {int(r)} rows" for n, r in zip(self.names, self.rows))

    def describe(self) -> str:
        """``name: share/rows`` of every source, for messages."""
        return ", ".join(f"{n}: {int(c)} of {int(r)} rows" for n, c, r
                         in zip(self.names, self.shares, self.rows))
