"""The resume state of :class:`~packtool.loader.distributed.PackedIterableDataset` (no torch).

A state is a dict of ints, bools, strings and lists (JSON- and ``torch.save``-safe):

- ``epoch``; the order's fixed fields ``order`` (the version of the epoch order,
  :data:`~packtool.loader.plan.ORDER_VERSION`; 1 in states saved before it was recorded),
  ``seed``, ``shuffle``, ``shuffle_buffer``, ``drop_last`` and ``mixture`` (each source's name,
  rows and rows per epoch, and a digest of which rows it holds);
- ``phases``: the finished phases of the epoch (``[world_size, num_workers, [rows yielded by
  each worker], rows yielded twice]``, and a fifth entry, the DataLoader batch size, when its
  workers' runs were cut to whole batches: :class:`~packtool.loader.plan.Phase`), empty until
  a job is resized; a phase of three entries was saved before the rows yielded twice were recorded,
  and is read by the rule of then (:data:`~packtool.loader.plan.PHASE_RULE` 1: its unconsumed
  even-up repeats carried into the rest), so the state resumes as it would have;
- ``world_size``, ``num_workers`` (0 workers count as 1), ``rank`` and
  ``dataloader_batch_size`` (None, or the B its workers' runs are whole batches of; absent in
  states saved before it was recorded: None) of the process that saved it, and where it
  stands in the current phase: ``worker`` and ``yielded`` (an int, one
  worker's state: what torchdata's ``StatefulDataLoader`` keeps per worker), or ``worker``
  None and ``yielded`` a list (every worker of the rank: a *whole* state).

:func:`normalize` reads that form, the first loader's (version 1) and a ``StatefulDataLoader``
``state_dict()`` (its workers' states merged into one whole state), so a dataset loads whatever
a trainer checkpointed. :func:`finished` tells a state taken after the epoch's last row: loading
it starts the next epoch (never the same one again).
"""

from __future__ import annotations

import numpy as np

from packtool.loader.plan import ORDER_VERSION, EpochPlan, Phase, orders_agree, rank_rows, \
    worker_bounds

__all__ = ["STATE_VERSION", "ORDER_FIELDS", "normalize", "runs", "finished", "worker_finished",
           "untouched", "worker_untouched", "mismatch"]

#: The version :meth:`state_dict` writes.
STATE_VERSION = 2
#: Fields that must match for a mid-epoch resume (the order depends on them).
ORDER_FIELDS = ("order", "seed", "shuffle", "shuffle_buffer", "drop_last", "mixture")

# torchdata StatefulDataLoader keys (torchdata.stateful_dataloader, versions 0.8 to 0.11)
_SNAPSHOT, _WORKERS, _STEPS = "_snapshot", "_worker_snapshots", "_steps_since_snapshot"
_DATASET_STATE = "dataset_state"


def _loader_state(state: dict) -> dict | None:
    """The whole state inside a ``StatefulDataLoader.state_dict()``, or None when ``state`` is
    not one."""
    if _SNAPSHOT in state:  # worker processes
        if state.get(_STEPS, 0):
            raise ValueError(
                f"this DataLoader state is {state[_STEPS]} batches past its last snapshot, "
                "which only StatefulDataLoader.load_state_dict can replay (same world size, "
                "worker count and batch size); to load it into the dataset (another size), "
                "save it with StatefulDataLoader(snapshot_every_n_steps=1) (the default)")
        workers = state[_SNAPSHOT].get(_WORKERS) or {}
        subs = []
        for key in sorted(workers, key=lambda k: int(str(k).rsplit("_", 1)[-1])):
            sub = (workers[key] or {}).get(_DATASET_STATE)
            if sub is None:
                raise ValueError(f"the DataLoader state holds no dataset state for {key}; it "
                                 "was not saved from a PackedIterableDataset")
            subs.append(normalize(sub))
        if not subs:
            raise ValueError("the DataLoader state holds no worker state")
        return _merge(subs)
    if _DATASET_STATE in state and "_num_yielded" in state:  # no workers
        sub = state[_DATASET_STATE]
        if sub is None:
            raise ValueError("the DataLoader state holds no dataset state; it was not saved "
                             "from a PackedIterableDataset")
        return normalize(sub)
    return None


def _merge(subs: list[dict]) -> dict:
    """One whole state from the states of every worker of one rank."""
    first = subs[0]
    same = ("epoch", "phases", "world_size", "num_workers", "dataloader_batch_size") + ORDER_FIELDS
    for s in subs[1:]:
        bad = [k for k in same if s.get(k) != first.get(k)]
        if bad:
            raise ValueError(f"the workers' states disagree on {', '.join(bad)}; they come "
                             "from different loaders")
    K = first["num_workers"]
    if len(subs) != K or sorted(s["worker"] for s in subs) != list(range(K)):
        raise ValueError(f"the DataLoader state holds {len(subs)} worker states for "
                         f"{K} workers")
    out = dict(first)
    out["worker"] = None
    out["yielded"] = [s["yielded"] for s in sorted(subs, key=lambda s: s["worker"])]
    return out


def normalize(state) -> dict:
    """The version-2 form of ``state``: a dataset state (version 1 or 2, one worker's or
    whole) or a torchdata ``StatefulDataLoader`` state.

    Every field is checked (type, range, and rows yielded that fit the runs its phases give).

    Raises:
        ValueError: not a state of this dataset, an unknown version, a malformed field (one
            line naming it), or a DataLoader state that cannot say what every worker yielded.
    """
    if not isinstance(state, dict):
        raise ValueError(f"a state is a dict, got {type(state).__name__}")
    inner = _loader_state(state)
    if inner is not None:
        return inner
    version = state.get("version")
    if version == 1:
        try:
            out = {"version": STATE_VERSION, "order": 1, "epoch": state["epoch"],
                   "seed": state["seed"],
                   "shuffle": state["shuffle"], "shuffle_buffer": state["shuffle_buffer"],
                   "drop_last": state["drop_last"], "mixture": {"num_rows": state["num_rows"]},
                   "phases": [], "world_size": state["world_size"],
                   "num_workers": state["num_workers"], "rank": state["rank"],
                   "worker": state["worker"], "yielded": state["yielded"],
                   "dataloader_batch_size": None}
        except KeyError as exc:
            raise ValueError(f"malformed state (KeyError: {exc})") from None
        _check(out)
        return out
    if version != STATE_VERSION:
        raise ValueError(f"state version {version!r}, expected {STATE_VERSION} (or 1)")
    try:
        out = dict(state)
        for k in ("epoch", "world_size", "num_workers", "rank", "yielded", "worker"):
            out[k] = state[k] if k != "rank" else state.get("rank", 0)
        out["dataloader_batch_size"] = state.get("dataloader_batch_size")
        phases = state.get("phases") or []
        if not isinstance(phases, (list, tuple)) or not all(
                isinstance(p, (list, tuple)) and len(p) in (3, 4, 5) and _int(p[0], 1)
                and _int(p[1], 1) and isinstance(p[2], (list, tuple))
                and all(_int(v) for v in p[2]) and (len(p) == 3 or _int(p[3]))
                and (len(p) < 5 or _int(p[4], 1))
                for p in phases):
            raise ValueError(f"phases {phases!r} are not [[world_size, num_workers, "
                             "[rows per worker], rows yielded twice(, batch size)], ...]")
        out["phases"] = [Phase.from_list(p).to_list() for p in phases]
        if isinstance(out["yielded"], tuple):
            out["yielded"] = list(out["yielded"])
        for k in ORDER_FIELDS:
            out[k] = state[k] if k != "order" else state.get("order", 1)  # saved before: 1
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"malformed state ({type(exc).__name__}: {exc})") from None
    _check(out)
    return out


def _int(x, lo: int = 0) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= lo


def _check(st: dict) -> None:
    """Every field of a version-2 state: type, range and consistency (the rows yielded fit the
    runs its phases give).

    Raises:
        ValueError: ``malformed state: <field> ...``, one line.
    """
    def bad(field, why):
        raise ValueError(f"malformed state: {field} {why}; load a state_dict() this dataset or "
                         "its StatefulDataLoader saved")

    for k in ("epoch", "seed"):
        if not _int(st[k]):
            bad(k, f"is {st[k]!r}, not a non-negative integer")
    if not _int(st["order"], 1):
        bad("order", f"is {st['order']!r}, not an order version (an integer >= 1)")
    for k in ("shuffle", "drop_last"):
        if not isinstance(st[k], bool):
            bad(k, f"is {st[k]!r}, not True or False")
    if not _int(st["shuffle_buffer"], 1):
        bad("shuffle_buffer", f"is {st['shuffle_buffer']!r}, not an integer >= 1")
    mix = st["mixture"]
    ok = isinstance(mix, dict) and (
        ("sources" in mix and isinstance(mix["sources"], list) and mix["sources"] and all(
            isinstance(x, (list, tuple)) and len(x) == 3 and isinstance(x[0], str)
            and _int(x[1]) and _int(x[2]) for x in mix["sources"]))
        or ("num_rows" in mix and _int(mix["num_rows"])))
    if ok and "content" in mix:  # saved since states name each source's rows
        ok = isinstance(mix["content"], list) and len(mix["content"]) == len(
            mix.get("sources", ())) and all(isinstance(c, str) for c in mix["content"])
    if not ok:
        bad("mixture", f"is {mix!r}, not {{'sources': [[name, rows, share], ...], "
            "'content': [hex, ...]}}")
    W, K, rank, worker, y = (st["world_size"], st["num_workers"], st.get("rank", 0),
                             st["worker"], st["yielded"])
    if not _int(W, 1) or not _int(K, 1):
        bad("world_size / num_workers", f"are {W!r} / {K!r}, not integers >= 1")
    if not _int(rank) or rank >= W:
        bad("rank", f"is {rank!r}, not in 0 .. {W - 1}")
    B = st.get("dataloader_batch_size")
    if B is not None and not _int(B, 1):
        bad("dataloader_batch_size", f"is {B!r}, not None or an integer >= 1")
    if isinstance(y, list):
        if worker is not None or len(y) != K or not all(_int(v) for v in y):
            bad("yielded", f"is {y!r}, not {K} non-negative integers (one per worker)")
    elif not _int(y) or not (_int(worker) and worker < K):
        bad("yielded / worker", f"are {y!r} / {worker!r}, not a non-negative integer and a "
            f"worker in 0 .. {K - 1}")
    try:
        lengths = runs(st)
    except ValueError as exc:
        bad("phases", f"do not fit this epoch ({exc})")
    counts = y if isinstance(y, list) else {worker: y}
    items = enumerate(counts) if isinstance(counts, list) else counts.items()
    for w, v in items:
        if v > lengths[w]:
            bad("yielded", f"says worker {w} yielded {v} rows of a run of {lengths[w]}")


def epoch_rows_of(state: dict) -> int:
    """N, rows of the saved epoch, from the state's own mixture record."""
    mix = state["mixture"]
    if "sources" in mix:
        return sum(int(c) for _, _, c in mix["sources"])
    return int(mix["num_rows"])


def runs(state: dict) -> list[int]:
    """Rows each worker of the state's current phase yields in its whole run (K ints)."""
    K, W = state["num_workers"], state["world_size"]
    plan = EpochPlan(epoch_rows_of(state), [Phase.from_list(p) for p in state["phases"]],
                     seed=state["seed"], epoch=state["epoch"], shuffle=False, shuffle_buffer=1,
                     drop_last=state["drop_last"])
    q = rank_rows(plan.length(), W, state["drop_last"])
    B = state.get("dataloader_batch_size")
    return [b - a for a, b in (worker_bounds(q, w, K, B) for w in range(K))]


def finished(state: dict) -> bool:
    """True when every worker of the state's current phase has yielded its whole run (the
    checkpoint was taken after the epoch's last row). A single worker's state of several
    workers cannot tell (:func:`worker_finished` says whether that one worker is done), and
    counts as unfinished."""
    y = state["yielded"]
    if not isinstance(y, list):
        if state["num_workers"] != 1:
            return False
        y = [y]
    return all(v >= n for v, n in zip(y, runs(state)))


def untouched(state: dict) -> bool:
    """True when the state was taken before any row of its epoch was read (right after
    ``set_epoch``): no earlier phase and nothing yielded, by the one worker of a single-worker
    run or by every worker of a whole state. It resumes as that epoch's start, under any
    options. A single worker's state of several cannot tell, and counts as read (its worker
    learns from its siblings: :func:`worker_untouched`)."""
    y = state["yielded"]
    if not isinstance(y, list):
        if state["num_workers"] != 1:
            return False
        y = [y]
    return not state["phases"] and not any(y)


def worker_untouched(state: dict) -> bool:
    """True when the worker whose state this is (or, for a whole state, every worker) had read
    no row of the epoch: no earlier phase and nothing yielded. The epoch was untouched when
    every sibling's state says so too."""
    if isinstance(state["yielded"], list):
        return untouched(state)
    return not state["phases"] and not state["yielded"]


def worker_finished(state: dict) -> bool:
    """True when the worker whose state this is (or, for a whole state, every worker) has
    yielded its whole run of the current phase."""
    if isinstance(state["yielded"], list):
        return finished(state)
    return state["yielded"] >= runs(state)[state["worker"]]


def mismatch(state: dict, mine: dict) -> list[str]:
    """The order fields (:data:`ORDER_FIELDS`) in which ``state`` differs from ``mine``, each
    as a short phrase: ``seed (saved X, now Y)``; for the mixture, what changed in it (the
    sources, or the sources whose rows or rows per epoch changed, old -> new: see
    :func:`_mixture_change`)."""
    bad = []
    for k in ORDER_FIELDS:
        a, b = state.get(k), mine.get(k)
        if k == "order":
            same, why = orders_agree(a or 1, b or ORDER_VERSION, _arrangement(state["mixture"]))
            if not same:
                bad.append(f"the epoch order (saved under order version {a}, this packtool "
                           f"reads version {b}, in which {why}: finish the epoch with the "
                           "packtool that saved the state)")
        elif k == "mixture":
            bad += [f"the mixture: {x}" for x in _mixture_change(a or {}, b or {})]
        elif a != b:
            bad.append(f"{k} (saved {a!r}, now {b!r})")
    return bad


def _arrangement(mix: dict) -> list[tuple[int, int]]:
    """(rows, rows per epoch) of each source of a state's mixture record."""
    if "num_rows" in mix:  # a version-1 state: one output, every row once per epoch
        return [(int(mix["num_rows"]), int(mix["num_rows"]))]
    return [(int(x[1]), int(x[2])) for x in mix.get("sources", [])]


def _names(sources: list) -> str:
    return ", ".join(repr(x[0]) for x in sources)


def _mixture_change(a: dict, b: dict) -> list[str]:
    """What differs between the mixture record ``a`` of a state and ``b`` of this dataset
    (:meth:`~packtool.loader.mixture.Mixture.fingerprint`), as phrases naming the sources:
    other sources; the sources whose rows differ (another output under that name); those whose
    rows per epoch differ (the weights or ``rows_per_epoch`` changed), ``old -> new``; the same
    names and counts but other rows. Empty when they match."""
    now = b.get("sources", [])
    if "num_rows" in a:  # a version-1 state: one output, every row once per epoch
        if len(now) == 1 and now[0][1] == a["num_rows"] == now[0][2]:
            return []
        if len(now) == 1:
            return [f"rows per epoch {a['num_rows']} -> {now[0][2]} (of {now[0][1]} rows)"]
        return [f"sources: one output of {a['num_rows']} rows -> {_names(now)}"]
    saved = a.get("sources", [])
    if [x[0] for x in saved] != [x[0] for x in now]:
        return [f"sources {_names(saved)} -> {_names(now)}"]
    out = []
    rows = [f"{x[0]!r} {x[1]} -> {y[1]}" for x, y in zip(saved, now) if x[1] != y[1]]
    if rows:
        out.append(f"rows of source{'s' if len(rows) > 1 else ''} {', '.join(rows)} "
                   "(another output under that name)")
    shares = [f"{x[0]!r} {x[2]} -> {y[2]}" for x, y in zip(saved, now) if x[2] != y[2]]
    if shares:
        out.append(f"rows per epoch of source{'s' if len(shares) > 1 else ''} "
                   f"{', '.join(shares)} (the weights or rows_per_epoch changed)")
    if not out:
        # a state saved before states named each source's rows cannot tell them apart
        old_c, new_c = a.get("content"), b.get("content")
        if old_c is not None and new_c is not None and old_c != new_c:
            other = [x[0] for x, p, q in zip(now, old_c, new_c) if p != q]
            out.append(f"the rows of source{'s' if len(other) > 1 else ''} "
                       f"{', '.join(repr(n) for n in other)} (the same name and row count, "
                       "but other rows: repacked with other options or inputs, or another "
                       "output)")
    return out
