"""How the loader's datasets open a packed output: one call, the one reader.

The datasets read through :class:`packtool.formats.packed.PackedOutput` (no pyarrow here), with
the labels convention their items carry and, for an output in a store, an optional local cache.
"""

from __future__ import annotations

import os

__all__ = ["check_label_masks", "check_rows_add_up", "open_source", "warn_if_stale"]


def open_source(path, labels: str | None, *, max_open_files: int = 64,
                cache_dir: str | os.PathLike | None = None, cache_limit: int | str | None = None,
                integrity: str = "footer"):
    """The :class:`~packtool.formats.packed.PackedOutput` of ``path`` and the labels convention
    items carry.

    Args:
        path: the packed output: a directory, a ``file:`` URI or a store URI, or a
            :class:`~packtool.formats.packed.PackedOutput` already open (used as it is).
        labels: ``unshifted``, ``shifted`` or None (the convention the output records).
        max_open_files: open shard handles per process.
        cache_dir, cache_limit: a :class:`~packtool.formats.cache.ShardCache` for a store output
            (both or neither).
        integrity: as :meth:`~packtool.formats.packed.PackedOutput.open`.

    Warns:
        UserWarning: a held-out output of ``pack --holdout`` that its training output no
            longer pairs with (:func:`warn_if_stale`).

    Raises:
        ManifestError: not a complete packed output, a shard that differs from its manifest,
            or shards whose rows do not add up to its totals (:func:`check_rows_add_up`).
        ValueError: an unknown ``labels`` convention, or a cache half given.
    """
    from packtool.formats.packed import PackedOutput

    if labels not in (None, "unshifted", "shifted"):
        raise ValueError(f"labels must be 'unshifted' or 'shifted', got {labels!r}")
    if (cache_dir is None) != (cache_limit is None):
        raise ValueError("give both cache_dir and cache_limit (e.g. cache_limit='50G'), or neither")
    if isinstance(path, PackedOutput):
        check_rows_add_up(path)
        return path, labels or path.labels.convention
    cache = None
    if cache_dir is not None:
        from packtool.formats.cache import ShardCache

        cache = ShardCache(cache_dir, cache_limit)
    # PackedOutput.open refuses rows that do not add up to the totals (check_rows_add_up)
    out = PackedOutput.open(path, integrity=integrity, cache=cache, max_open_files=max_open_files)
    warn_if_stale(out)
    return out, labels or out.labels.convention


def warn_if_stale(output) -> None:
    """Warn (``UserWarning``) when ``output`` (a
    :class:`~packtool.formats.packed.PackedOutput`) is a held-out output of ``pack --holdout``
    that its training output no longer pairs with: its documents may be among the training
    rows (:func:`~packtool.formats.manifest.stale_holdout`; reads one manifest)."""
    import warnings

    from packtool.formats.manifest import stale_holdout

    said = stale_holdout(output.manifest, output.location)
    if said:
        warnings.warn(said, stacklevel=3)


def check_rows_add_up(output) -> None:
    """Refuse an output whose manifest lists shards of other rows than its totals count (a
    shard's entry dropped or emptied, or the totals edited), for a
    :class:`~packtool.formats.packed.PackedOutput` handed over already open (one
    :meth:`~packtool.formats.packed.PackedOutput.open` opened is checked there): a loader
    would serve the rows left without a word.

    Raises:
        ManifestError: names the output, both counts and the fix.
    """
    from packtool.formats.manifest import check_rows_add_up as check

    check(output.manifest, output.location.display)


def check_label_masks(output, columns) -> None:
    """Refuse item ``columns`` without ``labels`` for an output whose stored labels keep
    targets -100 on purpose (an input labels column or loss mask: SFT prompts, the manifest's
    ``tokens_label_masked``): a collate function would rebuild the labels from the document
    boundaries alone and train those tokens.

    Args:
        output: a :class:`~packtool.formats.packed.PackedOutput`.
        columns: the columns items will carry.

    Raises:
        ValueError: names the output, the masked tokens and the fix.
    """
    if "labels" in columns or not output.manifest.label_masked:
        return
    n = output.manifest.totals.tokens_label_masked
    raise ValueError(
        f"{output.location.display}: columns= leaves out labels, but its stored labels keep "
        f"{n:,} tokens -100 on purpose (input label masks or loss masks, e.g. prompts) that no "
        "batch can rebuild from the document boundaries, so they would be trained: add "
        "'labels' to columns")
