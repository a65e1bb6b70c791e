"""The ranks of one job agree on what decides each rank's rows.

:class:`~packtool.loader.distributed.PackedIterableDataset` splits one epoch's order among the
ranks; each rank computes that order by itself, from (seed, epoch, world size, the sources and
their shares, shuffle, shuffle buffer, drop_last, the resume point). Where two ranks compute
different orders, their slices overlap and miss each other: some rows come twice, others never,
and nothing else would tell. :func:`check_ranks_agree` gathers each rank's values with one
collective of ``torch.distributed`` and refuses a disagreement in one line
(:class:`~packtool.errors.LoaderError`) on every rank alike (each rank sees every value, so all
raise together and none is left waiting in a later collective).

The collective runs where every rank arrives together, in the training process: the dataset's
construction, ``set_epoch`` and ``load_state_dict``; never in a DataLoader worker (a forked
worker inherits an initialised process group it must not use). It runs on a gloo group of the
default group's ranks, made once per process group at the first check (itself a collective),
so no device is involved whatever the default backend (the object collectives of an NCCL group
need ``torch.cuda.set_device`` on every rank), and with its own timeout
(``PACKTOOL_CHECK_RANKS_TIMEOUT``, 600 s): a rank that never reaches a check (``set_epoch``
called on some ranks only, a dataset built on one rank) fails it once the wait is over, instead
of leaving the others waiting for ever. Without gloo built in, or on an MPI default group, it
runs on the default group.
"""

from __future__ import annotations

import os
from datetime import timedelta

from packtool.errors import LoaderError, first_line

__all__ = ["FIELDS", "TIMEOUT_ENV", "check_ranks_agree", "describe_ranks", "verdict"]

#: The fields every rank must hold the same value of, in the order a disagreement is reported,
#: with the fix each one names.
FIELDS = (
    ("world_size", "world_size",
     "pass the same world_size on every rank (or leave it to torch.distributed)"),
    ("seed", "seed",
     "pass the same seed on every rank (a per-rank seed such as base + rank breaks the split: "
     "the dataset already gives each rank its own rows)"),
    ("epoch", "epoch",
     "call set_epoch(e) with the same e on every rank, every epoch (and pass the same epoch=)"),
    ("sources", "sources (name: rows per epoch of rows)",
     "give every rank the same outputs, weights and rows_per_epoch"),
    ("content", "the sources' rows (a digest of their shards)",
     "give every rank the same outputs (the same packed shards)"),
    ("order", "order version", "run the same packtool version on every rank"),
    ("shuffle", "shuffle", "pass the same shuffle on every rank"),
    ("shuffle_buffer", "shuffle_buffer", "pass the same shuffle_buffer on every rank"),
    ("drop_last", "drop_last", "pass the same drop_last on every rank"),
    ("dataloader_batch_size", "dataloader_batch_size",
     "pass the same dataloader_batch_size on every rank (the DataLoader's batch_size): "
     "otherwise the ranks' DataLoaders yield different numbers of batches"),
    ("resume", "resume point (the loaded state's epoch and phases)",
     "load the same state on every rank (one rank's StatefulDataLoader state_dict()), or none "
     "on any"),
)


def _spans(ranks: list[int]) -> str:
    """``"0, 2-5, 9"``: sorted process ranks as runs."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out)


def describe_ranks(values: list, limit: int = 4) -> str:
    """``"0 on process rank 0, 1 on process ranks 1-3"``: which process ranks hold which value
    (``values[i]``: process rank ``i``'s), the values in order of their first rank, at most
    ``limit`` of them named."""
    groups: dict = {}
    for r, v in enumerate(values):
        groups.setdefault(repr(v), []).append(r)
    parts = [f"{v} on process rank{'s' if len(rs) > 1 else ''} {_spans(rs)}"
             for v, rs in list(groups.items())[:limit]]
    if len(groups) > limit:
        parts.append(f"{len(groups) - limit} more values")
    return ", ".join(parts)


def verdict(gathered: list[dict], where: str) -> str | None:
    """The one-line refusal of the ranks' values ``gathered`` (process rank ``i``'s at index
    ``i``, each a dict of :data:`FIELDS` and ``rank``, the dataset's rank), or None when they
    agree: every field the same on every rank, and (when the dataset's world size is above 1)
    each of the dataset's ranks 0 .. world_size - 1 held by the same number of processes (one
    each, or one per member of a tensor- or pipeline-parallel group)."""
    tail = ("; check_ranks=False turns this check off, for a dataset not built on every rank "
            "of the default process group only")
    effect = "their slices of the epoch overlap and miss each other"
    for key, name, fix in FIELDS:
        values = [g.get(key) for g in gathered]
        if key == "world_size" and values[0] == 1 and all(v == 1 for v in values):
            if any(g.get(k) != gathered[0].get(k) for g in gathered
                   for k in ("sources", "content")):
                return None  # each process reads data of its own, whole: nothing to share
            # one stream read whole by every process: what splits it afterwards (accelerate's
            # IterableDatasetShard under the Trainer) needs it the same on every process
            effect = ("the one stream each process reads whole, and a Trainer's data loader "
                      "then splits among them, differs between processes")
            continue
        if any(v != values[0] for v in values):
            return (f"the ranks disagree {where} on the dataset's {name}: "
                    f"{describe_ranks(values)}, so {effect} (some rows twice, others never); "
                    f"{fix}" + tail)
    size = gathered[0]["world_size"]
    if size < 2:
        return None  # no rank split
    held: dict = {}
    for p, g in enumerate(gathered):
        held.setdefault(g["rank"], []).append(p)
    ranks = describe_ranks([g["rank"] for g in gathered])
    missing = [r for r in range(size) if r not in held]
    if missing:
        return (f"{where}, no process reads dataset rank{'s' if len(missing) > 1 else ''} "
                f"{_spans(missing)} of world_size={size} (dataset rank {ranks}), so "
                f"{'their' if len(missing) > 1 else 'its'} rows never come; give each process "
                "its own rank= (or leave rank and world_size to torch.distributed)" + tail)
    counts = {r: len(ps) for r, ps in held.items()}
    if len(set(counts.values())) > 1:
        return (f"{where}, the dataset's ranks are held by unequal numbers of processes "
                f"(dataset rank {ranks}), so some ranks' rows are trained on more often than "
                "others'; give each process its own rank= (or leave rank and world_size to "
                "torch.distributed)" + tail)
    return None


#: Seconds every process waits for the others at a check (``PACKTOOL_CHECK_RANKS_TIMEOUT``,
#: read when the check's group is made); then the check fails instead of waiting for ever.
TIMEOUT_ENV, TIMEOUT_S = "PACKTOOL_CHECK_RANKS_TIMEOUT", 600.0

_GROUP: tuple | None = None  # (the default group it was made for, the group the checks use)


def _timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw.strip() else TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise LoaderError(f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds; unset it "
                          f"(default {TIMEOUT_S:g}) or give one such as 600")
    return value


def _group():
    """The group the checks gather on: a gloo group of the default group's ranks, made once
    per default group with the check's timeout (no device involved, whatever the default
    backend: an NCCL group's object collectives need ``torch.cuda.set_device`` on every rank);
    the default group itself where gloo is not built in or the backend is MPI (no store to
    make a group with)."""
    global _GROUP
    import torch.distributed as dist

    world = dist.group.WORLD
    if _GROUP is not None and _GROUP[0] is world:
        return _GROUP[1]
    if not dist.is_gloo_available() or str(dist.get_backend()) == "mpi":
        group = None
    else:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=_timeout()))
    _GROUP = (world, group)
    return group


def check_ranks_agree(mine: dict, where: str) -> None:
    """Refuse ranks that would split an epoch differently: gather ``mine`` (this rank's
    :data:`FIELDS` values and ``rank``, small picklable values) from every process of the
    default ``torch.distributed`` group, with one ``all_gather_object`` on a gloo group of its
    ranks, and compare (:func:`verdict`). Does nothing without an initialised process group of
    two or more processes. Every process of the default group must call it at the same point
    (a collective); never in a DataLoader worker. A process that waits longer than
    ``PACKTOOL_CHECK_RANKS_TIMEOUT`` seconds (600) for the others fails instead.

    Args:
        mine: field -> value of this process.
        where: the call site, for the message (``"at construction"``).

    Raises:
        LoaderError: the ranks disagree (the same message on every rank), or not every
            process reached the check in time (a rank that never built the dataset, called
            ``set_epoch`` or ``load_state_dict``), or a bad ``PACKTOOL_CHECK_RANKS_TIMEOUT``.
    """
    global _GROUP
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    try:
        group = _group()
        gathered: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, mine, group=group)
    except RuntimeError as exc:  # a timeout, or a peer gone: this group is of no more use
        _GROUP = None
        raise LoaderError(
            f"not every process of the job reached the dataset's cross-rank check {where} "
            f"({first_line(exc)}); build the dataset, call set_epoch and load_state_dict on "
            "every rank at the same point, or pass check_ranks=False where the dataset is built "
            f"on some ranks only (the wait: {TIMEOUT_ENV}, {TIMEOUT_S:g} s by default)") from exc
    bad = verdict(gathered, where)
    if bad is not None:
        raise LoaderError(bad)
