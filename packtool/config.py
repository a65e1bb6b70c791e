"""Frozen, keyword-only configs; each validates itself and names the bad option."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from packtool.core.packing import MAX_CAPACITY
from packtool.errors import ConfigError
from packtool.types import LabelMode, Overflow, Strategy

__all__ = ["PackConfig"]


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    """Everything ``packtool pack`` needs."""

    inputs: tuple[str, ...]
    """INPUT paths: Parquet files or directories (searched recursively)."""
    output: str
    """OUTPUT directory."""
    capacity: int = 2048
    """Tokens per packed row (C), 2..2**24."""
    column: str = "input_ids"
    """Token column of the input (a list of integers)."""
    strategy: Strategy = Strategy.OBFD
    """Packing strategy."""
    overflow: Overflow = Overflow.SPLIT
    """Policy for documents longer than the capacity."""
    labels: LabelMode = LabelMode.UNSHIFTED
    """Labels convention written."""
    pad_id: int = 0
    """Token id written on padding (int32)."""
    append_eos: int | None = None
    """If set, this id is appended to every non-empty document before packing."""
    seed: int = 0
    """Seed of the output row shuffle."""
    shuffle: bool = True
    """Shuffle output rows (False keeps creation order)."""
    rows_per_shard: int = 8192
    """Rows per output shard."""
    rows_per_group: int = 1024
    """Rows per Parquet row group (bounds memory per worker)."""
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Threads laying out and encoding shards."""
    overwrite: bool = False
    """Replace an existing non-empty OUTPUT."""

    def __post_init__(self) -> None:
        def bad(name, value, why):
            raise ConfigError(f"--{name.replace('_', '-')} {value!r}: {why}")

        for name, enum in (("strategy", Strategy), ("overflow", Overflow), ("labels", LabelMode)):
            try:
                object.__setattr__(self, name, enum(getattr(self, name)))
            except ValueError:
                bad(name, getattr(self, name), f"choose one of {', '.join(e.value for e in enum)}")
        if not self.inputs:
            raise ConfigError("give at least one INPUT")
        if not 2 <= self.capacity <= MAX_CAPACITY:
            bad("capacity", self.capacity, f"must be in 2..{MAX_CAPACITY} tokens")
        if not -(2**31) <= self.pad_id < 2**31:
            bad("pad_id", self.pad_id, "must fit int32")
        if self.append_eos is not None and not 0 <= self.append_eos < 2**31:
            bad("append_eos", self.append_eos, "must be a token id in 0..2**31-1")
        if self.rows_per_shard < 1:
            bad("rows_per_shard", self.rows_per_shard, "must be >= 1")
        if self.rows_per_group < 1:
            bad("rows_per_group", self.rows_per_group, "must be >= 1")
        if self.workers < 1:
            bad("workers", self.workers, "must be >= 1")
        if not 0 <= self.seed < 2**63:
            bad("seed", self.seed, "must be in 0..2**63-1")

    def to_dict(self) -> dict:
        """The options as JSON-ready values (what the manifest records)."""
        d = asdict(self)
        d["inputs"] = list(self.inputs)
        for k in ("strategy", "overflow", "labels"):
            d[k] = d[k].value
        return d

    def layout_options(self) -> dict:
        """The options that decide the output bytes (workers and overwrite do not)."""
        d = self.to_dict()
        for k in ("inputs", "output", "workers", "overwrite"):
            d.pop(k)
        return d
