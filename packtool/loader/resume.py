"""The resume state of :class:`~packtool.loader.distributed.PackedIterableDataset` (no torch).

A state is a dict of ints, bools, strings and lists (JSON- and ``torch.save``-safe):

- ``epoch``; the order's fixed fields ``seed``, ``shuffle``, ``shuffle_buffer``, ``drop_last``
  and ``mixture`` (each source's name, rows and rows per epoch);
- ``phases``: the finished phases of the epoch (``[world_size, num_workers, [rows yielded by
  each worker]]``, :class:`~packtool.loader.plan.Phase`), empty until a job is resized;
- ``world_size``, ``num_workers`` (0 workers count as 1) and ``rank`` of the process that saved
  it, and where it stands in the current phase: ``worker`` and ``yielded`` (an int, one
  worker's state: what torchdata's ``StatefulDataLoader`` keeps per worker), or ``worker``
  None and ``yielded`` a list (every worker of the rank: a *whole* state).

:func:`normalize` reads that form, the first loader's (version 1) and a ``StatefulDataLoader``
``state_dict()`` (its workers' states merged into one whole state), so a dataset loads whatever
a trainer checkpointed. :func:`finished` tells a state taken after the epoch's last row: loading
it starts the next epoch (never the same one again).
"""

from __future__ import annotations

from packtool.loader.plan import EpochPlan, Phase, rank_rows, worker_bounds

__all__ = ["STATE_VERSION", "ORDER_FIELDS", "normalize", "runs", "finished", "worker_finished",
           "mismatch"]

#: The version :meth:`state_dict` writes.
STATE_VERSION = 2
#: Fields that must match for a mid-epoch resume (the order depends on them).
ORDER_FIELDS = ("seed", "shuffle", "shuffle_buffer", "drop_last", "mixture")

# torchdata StatefulDataLoader keys (torchdata.stateful_dataloader, versions 0.8 to 0.11)
_SNAPSHOT, _WORKERS, _STEPS = "_snapshot", "_worker_snapshots", "_steps_since_snapshot"
_DATASET_STATE = "dataset_state"


def _loader_state(state: dict) -> dict | None:
    """The whole state inside a ``StatefulDataLoader.state_dict()``, or None when ``state`` is
    not one."""
    if _SNAPSHOT in state:  # worker processes
        if state.get(_STEPS, 0):
            raise ValueError(
                f"this DataLoader state is {state[_STEPS]} batches past its last snapshot; "
                "save it with StatefulDataLoader(snapshot_every_n_steps=1) (the default) to "
                "resume at another world size or worker count")
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
    same = ("epoch", "phases", "world_size", "num_workers") + ORDER_FIELDS
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

    Raises:
        ValueError: not a state of this dataset, an unknown version, or a DataLoader state that
            cannot say what every worker yielded.
    """
    if not isinstance(state, dict):
        raise ValueError(f"a state is a dict, got {type(state).__name__}")
    inner = _loader_state(state)
    if inner is not None:
        return inner
    version = state.get("version")
    if version == 1:
        return {"version": STATE_VERSION, "epoch": int(state["epoch"]),
                "seed": state["seed"], "shuffle": state["shuffle"],
                "shuffle_buffer": state["shuffle_buffer"], "drop_last": state["drop_last"],
                "mixture": {"num_rows": int(state["num_rows"])}, "phases": [],
                "world_size": int(state["world_size"]),
                "num_workers": int(state["num_workers"]), "rank": int(state["rank"]),
                "worker": int(state["worker"]), "yielded": int(state["yielded"])}
    if version != STATE_VERSION:
        raise ValueError(f"state version {version!r}, expected {STATE_VERSION} (or 1)")
    try:
        out = dict(state)
        out["epoch"] = int(state["epoch"])
        out["phases"] = [Phase.from_list(p).to_list() for p in state.get("phases") or []]
        out["world_size"], out["num_workers"] = int(state["world_size"]), int(state["num_workers"])
        y = state["yielded"]
        out["yielded"] = [int(v) for v in y] if isinstance(y, (list, tuple)) else int(y)
        out["worker"] = None if state.get("worker") is None else int(state["worker"])
        for k in ORDER_FIELDS:
            out[k] = state[k]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"malformed state ({type(exc).__name__}: {exc})") from None
    if isinstance(out["yielded"], list) and len(out["yielded"]) != out["num_workers"]:
        raise ValueError(f"state yielded {out['yielded']} for {out['num_workers']} workers")
    return out


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
    return [b - a for a, b in (worker_bounds(q, w, K) for w in range(K))]


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


def worker_finished(state: dict) -> bool:
    """True when the worker whose state this is (or, for a whole state, every worker) has
    yielded its whole run of the current phase."""
    if isinstance(state["yielded"], list):
        return finished(state)
    return state["yielded"] >= runs(state)[state["worker"]]


def mismatch(state: dict, mine: dict) -> list[str]:
    """The order fields (:data:`ORDER_FIELDS`) in which ``state`` differs from ``mine``, as
    ``field (saved X, now Y)``."""
    bad = []
    for k in ORDER_FIELDS:
        a, b = state.get(k), mine.get(k)
        if k == "mixture" and "num_rows" in (a or {}):  # a version-1 state: one output
            srcs = (b or {}).get("sources", [])
            same = len(srcs) == 1 and srcs[0][1] == a["num_rows"] == srcs[0][2]
        else:
            same = a == b
        if not same:
            bad.append(f"{k} (saved {a!r}, now {b!r})")
    return bad
