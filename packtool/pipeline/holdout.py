"""``pack --holdout FRACTION``: the training rows and a held-out packed output, two packs.

The documents are split once, by :mod:`packtool.core.holdout` (seeded, whole documents, decided
per global document index). The same driver (:func:`packtool.pipeline.run_pack`) then runs
twice over the same input: into OUTPUT with the held-out documents left out, and into the
held-out OUTPUT with only them. Each output is complete on its own: the same contract, its own
manifest (its options record ``holdout`` and ``holdout_part``), its own lock and resume; a rerun
of the same command resumes whichever of the two is unfinished. ``doc_ids`` keep the global
document index in both, so the two outputs never share a document.

The cost is a second read of the input (the held-out pack reads and validates every document to
find its few); the plan and the writes of each pack cover only its own documents.
"""

from __future__ import annotations

import dataclasses

from packtool.core.holdout import count_held_out
from packtool.errors import InputError
from packtool.formats.reader import discover_inputs
from packtool.pipeline.read import file_rows, plan_reads

__all__ = ["run_holdout"]


def _check_sizes(cfg) -> None:
    """Refuse a split that leaves one side without documents, before anything is written."""
    files = discover_inputs(list(cfg.inputs), skip_unsupported=cfg.skip_unsupported)
    parts = plan_reads(files, cfg.column)  # footers only
    n = sum(file_rows(parts, len(files)))
    held = count_held_out(n, cfg.holdout, cfg.seed)
    if held == 0 or held == n:
        what = "no document" if held == 0 else "every document"
        raise InputError(f"--holdout {cfg.holdout} --seed {cfg.seed} holds out {what} of the "
                         f"{n:,} in INPUT; choose a fraction that leaves documents on both sides")


def run_holdout(cfg, run_pack, *, progress: bool = True):
    """Pack the documents not held out into ``cfg.output`` and the held-out ones into
    ``cfg.holdout_output``, with ``run_pack`` (:func:`packtool.pipeline.run_pack`, passed in so
    this module does not import its own package).

    Returns:
        The training pack's :class:`~packtool.pipeline.PackResult`, its ``holdout`` the held-out
        pack's.

    Raises:
        InputError: the split leaves one side empty; otherwise as :func:`run_pack`.
    """
    _check_sizes(cfg)
    train = run_pack(dataclasses.replace(cfg, holdout_part="train"), progress=progress)
    held = run_pack(dataclasses.replace(cfg, output=cfg.holdout_output, holdout_part="holdout"),
                    progress=progress)
    return dataclasses.replace(train, holdout=held)
