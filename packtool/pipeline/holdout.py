"""``pack --holdout FRACTION``: the training rows and a held-out packed output, two packs.

The documents are split once, by :mod:`packtool.core.holdout` (seeded, whole documents, decided
per global document index). The same driver (:func:`packtool.pipeline.run_pack`) then runs
twice over the same input: into OUTPUT with the held-out documents left out, and into the
held-out OUTPUT with only them. Each output is complete on its own: the same contract, its own
manifest (its options record ``holdout`` and ``holdout_part``), its own lock and resume; a rerun
of the same command resumes whichever of the two is unfinished. Both outputs are entered
(:class:`packtool.output.Output`: overlap with INPUT, a file, entries packtool did not write, a
finished pack of other options, the lock) before either pack writes anything, and the held-out
output stays locked while the training rows are written: a held-out output that cannot be
written stops the run before the training pack begins, and nothing is written to either. A
finished held-out pack that the run replaces goes (its manifest first) when the training pack
begins writing (:meth:`packtool.output.Output.tie`): the new training rows are never readable
beside the held-out rows of another run. ``doc_ids`` keep the global document index in both,
so the two outputs never share a document. Both manifests record their pairing
(:class:`~packtool.formats.manifest.HoldoutPairing`: an id both carry and where the other is),
so a held-out output that a later pack of OUTPUT does not write again is said to be stale: by
that pack, and by every reader of it (:func:`~packtool.formats.manifest.stale_holdout`).

The cost is a second read of the input (the held-out pack reads and validates every document to
find its few); the plan and the writes of each pack cover only its own documents.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from packtool.core.holdout import count_held_out
from packtool.errors import InputError, LocationError, PacktoolError
from packtool.formats.manifest import HoldoutPairing
from packtool.location import Location
from packtool.formats.reader import discover_inputs
from packtool.pipeline.read import file_rows, plan_reads
from packtool.signals import interruptible, stop_now, test_pause

__all__ = ["run_holdout"]

#: How messages name the held-out output when packtool named it (OUTPUT-holdout, beside
#: OUTPUT): the user gave no --holdout-output to be told about
DERIVED_ROLE = "held-out output"


def _derived_note(cfg) -> str | None:
    """What a message about the held-out output adds after its name when packtool named it
    ``OUTPUT-holdout`` (no ``--holdout-output`` given, or the same name): which destination it
    is and where its name comes from. None when the user named it otherwise."""
    out = Location.parse(cfg.output)
    try:
        beside = out.beside("-holdout")
    except LocationError:
        return None
    held = Location.parse(cfg.holdout_output)
    if held.identity() != beside.identity():
        return None
    return f"the held-out output, named after OUTPUT {out.display}"


def _name_held(exc: PacktoolError, cfg, note: str) -> None:
    """Add ``note`` after the held-out output's name that begins the message of ``exc`` (a
    store's missing bucket, unreachable endpoint or refused credentials, a lock held, ...), so
    that a user who gave only OUTPUT is told which destination failed."""
    shown = Location.parse(cfg.holdout_output).display
    text = str(exc)
    if text.startswith(f"{shown}:") and len(exc.args) == 1:
        exc.args = (f"{shown} ({note}){text[len(shown):]}",)


def _check_sizes(cfg) -> None:
    """Refuse a split that leaves one side without documents, before anything is written."""
    files = discover_inputs(list(cfg.inputs), skip_unsupported=cfg.skip_unsupported,
                            outputs=cfg.own_outputs())
    parts = plan_reads(files, cfg.column)  # footers only
    n = sum(file_rows(parts, len(files)))
    held = count_held_out(n, cfg.holdout, cfg.seed)
    if held == 0 or held == n:
        what = "no document" if held == 0 else "every document"
        raise InputError(f"--holdout {cfg.holdout} --seed {cfg.seed} holds out {what} of the "
                         f"{n:,} in INPUT; choose a fraction that leaves documents on both sides")


def run_holdout(cfg, prepare, run, interrupted, *, progress: bool = True):
    """Pack the documents not held out into ``cfg.output`` and the held-out ones into
    ``cfg.holdout_output``, with the steps of :func:`packtool.pipeline.run_pack` (passed in so
    this module does not import its own package): ``prepare(cfg)`` reads the footers,
    ``run(prepared, output, show, t0)`` packs into an entered output, ``interrupted(cfg,
    outputs)`` says what each output of an interrupted run holds.

    A finished held-out pack that the run replaces is removed (its manifest first) when the
    training pack begins writing, so no reader ever finds the new training rows beside the
    held-out rows of another run.

    Returns:
        The training pack's :class:`~packtool.pipeline.PackResult`, its ``holdout`` the held-out
        pack's.

    Raises:
        InputError: the split leaves one side empty; otherwise as :func:`run_pack` (an
        ``OutputError`` of either output before anything is written to either).
    """
    _check_sizes(cfg)
    show = progress and sys.stderr.isatty()
    t0 = time.perf_counter()
    train = prepare(dataclasses.replace(cfg, holdout_part="train"))
    held = prepare(dataclasses.replace(cfg, output=cfg.holdout_output, holdout_part="holdout"))
    # each manifest names the other and an id both carry: a held-out output that a later
    # pack of OUTPUT no longer pairs with is then told stale by its readers
    pairs = HoldoutPairing.of_pack(cfg.output, train.fp, cfg.holdout_output, held.fp)
    train = dataclasses.replace(train, pairing=pairs[0])
    note = _derived_note(cfg)
    held = dataclasses.replace(held, pairing=pairs[1],
                               **({"role": DERIVED_ROLE} if note else {}))
    out = held_out = None
    try:
        # the held-out output is entered (checked, locked) first and held while the training
        # rows are written; the training output is left before the held-out pack runs, so that
        # its end (Ctrl-C held once its manifest is written) never spans the other pack
        with interruptible(), held.output() as held_out:
            with train.output() as out:
                # a finished held-out pack that this run replaces goes when the training pack
                # begins writing: never readable beside the new training rows
                out.tie(held_out)
                trained = run(train, out, show, t0)
            if out.stop_noted:  # Ctrl-C or SIGTERM while the training manifest was committed
                stop_now(out.stop_noted)
            test_pause("holdout")
            # the held-out side's documents and tokens, as the training pack's read counted
            # them: its disk check asks for the space of those alone
            s = trained.stats
            held = dataclasses.replace(held, side=(s.docs_other_split, s.tokens_other_split))
            return dataclasses.replace(trained,
                                       holdout=run(held, held_out, show, time.perf_counter()))
    except KeyboardInterrupt:
        raise interrupted(cfg, [out, held_out]) from None
    except PacktoolError as exc:
        if note:
            _name_held(exc, cfg, note)
        raise
