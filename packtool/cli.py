"""The ``packtool`` command line: thin wrappers that parse options, build a config and call one
function.

One exit-status rule for every command (:mod:`packtool.errors`): 0 success; 1 bad input or
output data, a failed check or a missing dependency; 2 a command line that cannot run (click's
usage errors and :class:`~packtool.errors.ConfigError`); 130 interrupted (Ctrl-C). Every error
is one ``Error: ...`` line on stderr; ``packtool --debug CMD ...`` shows the traceback instead.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from packtool._version import __version__
from packtool.errors import (EXIT_DATA, EXIT_INTERRUPTED, InputError, Interrupted,
                             PacktoolError)
from packtool.types import Engine, LabelMode, Overflow, Strategy

__all__ = ["cli", "main"]


class _Failure(click.ClickException):
    """A one-line ``Error: ...`` with the exit status of the error it stands for."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class _Group(click.Group):
    """Maps every failure of a subcommand to one line and one exit status (see the module
    docstring); with ``--debug`` the original exception propagates with its traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own: usage errors exit 2, with the usage line
        except PacktoolError as exc:
            if ctx.meta.get("packtool.debug"):
                raise
            raise _Failure(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            if ctx.meta.get("packtool.debug"):
                raise
            raise _Failure("interrupted", EXIT_INTERRUPTED) from None
        except OSError as exc:
            # an I/O failure no layer turned into a PacktoolError (disk full, permissions)
            if ctx.meta.get("packtool.debug"):
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            raise _Failure(f"{where}{exc.strerror or exc}", EXIT_DATA) from None
        except Exception as exc:  # a bug: still one line, and how to see more
            if ctx.meta.get("packtool.debug"):
                raise
            raise _Failure(f"internal error ({type(exc).__name__}: {exc}); rerun as "
                           f"`packtool --debug {ctx.invoked_subcommand or ''} ...` for the "
                           "traceback and report it", EXIT_DATA) from None


class _ExistingPath(click.Path):
    """A local path that must exist; a missing one is an input error (exit 1) in every command,
    not a usage error. A URI (``s3://bucket/key``) is passed on as given: the reader looks it up
    in its filesystem and names it when it is missing."""

    def convert(self, value, param, ctx):
        from packtool.formats.reader import _location, is_remote

        if is_remote(value):
            return value
        value = _location(value)  # a file: URI is its local path
        if not os.path.lexists(value):
            raise InputError(f"{value}: no such file or directory; check the path")
        return super().convert(value, param, ctx)


def _choice(enum) -> click.Choice:
    return click.Choice([e.value for e in enum])


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="packtool")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug logs).")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: int) -> None:
    """Pack tokenized documents into fixed-capacity rows for document-masked LLM training."""
    ctx.meta["packtool.debug"] = debug
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(), metavar="INPUT... OUTPUT")
@click.option("--capacity", "-c", type=int, default=2048, show_default=True, metavar="C",
              help="Tokens per packed row.")
@click.option("--column", default="input_ids", show_default=True, metavar="NAME",
              help="Token column of the input (list of integer ids).")
@click.option("--strategy", type=_choice(Strategy), default="obfd", show_default=True,
              help="obfd: best-fit-decreasing; ordered: next-fit in input order; concat: "
                   "stream cut every C tokens.")
@click.option("--overflow", type=_choice(Overflow), default="split", show_default=True,
              help="Documents longer than C: split into chunks, truncate, drop, or error.")
@click.option("--labels", type=_choice(LabelMode), default="none", show_default=True,
              help="none: no labels column (readers derive the unshifted labels from input_ids "
                   "and segment_ids); unshifted: store them, the model shifts (Hugging Face); "
                   "shifted: store them already shifted.")
@click.option("--pad-id", type=int, default=0, show_default=True, metavar="ID",
              help="Token id written on padding.")
@click.option("--append-eos", type=int, default=None, metavar="ID",
              help="Append this end-of-document id to every document not already ending with it.")
@click.option("--prepend-bos", type=int, default=None, metavar="ID",
              help="Prepend this beginning-of-document id to every document not already "
                   "starting with it.")
@click.option("--attention-mask-column", default="auto", show_default=True, metavar="NAME",
              help="Input column whose 0 entries are removed before packing (padding); auto: "
                   "attention_mask when present; none: ignore.")
@click.option("--labels-column", default="auto", show_default=True, metavar="NAME",
              help="Input column of unshifted labels whose -100 entries (e.g. SFT prompts) stay "
                   "non-targets; auto: labels when present; none: ignore.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the row shuffle.")
@click.option("--no-shuffle", is_flag=True, help="Keep rows in creation order.")
@click.option("--rows-per-shard", type=int, default=8192, show_default=True, metavar="N",
              help="Rows per output Parquet file.")
@click.option("--row-group-mb", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, metavar="MIB",
              help="Parquet row-group size as MiB of per-token data (one random row decodes one "
                   "row group).")
@click.option("--workers", "-j", type=int, default=None, metavar="N",
              help="Threads for layout and encoding [default: all cores].")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUTPUT.")
@click.option("--window-docs", type=click.IntRange(min=1), default=None, metavar="N",
              help="Plan windows of N documents independently (row groups are cut; a few "
                   "extra rows per window); rows of all windows are mixed in the output "
                   "[default: one plan over all documents].")
@click.option("--engine", type=_choice(Engine), default="local", show_default=True,
              help="local: this process; ray: one Ray task per window (needs packtool[ray]; "
                   "--window-docs defaults to 250,000). Same bytes either way.")
@click.option("--ray-address", default=None, metavar="ADDRESS", envvar="RAY_ADDRESS",
              help="Ray cluster to join with --engine ray [default: start a local Ray on "
                   "--workers CPUs].")
@click.option("--holdout", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=None, metavar="FRACTION",
              help="Hold out this fraction of the documents (whole documents, drawn with "
                   "--seed) into a second packed output, for validation loss.")
@click.option("--holdout-output", default=None, metavar="DIR",
              help="Where the held-out documents are packed [default: OUTPUT-holdout].")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars and no summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def pack(ctx, paths, capacity, column, strategy, overflow, labels, pad_id, append_eos,
         prepend_bos, attention_mask_column, labels_column, seed, no_shuffle, rows_per_shard,
         row_group_mb, workers, overwrite, window_docs, engine, ray_address, holdout,
         holdout_output, quiet, as_json):
    """Pack tokenized Parquet INPUT files or directories into OUTPUT.

    Writes part-NNNNN.parquet shards (input_ids, segment_ids, position_ids, [labels],
    cu_seqlens, max_seqlen, num_targets, doc_ids, doc_offsets) and the manifest, last. Rerunning
    an interrupted pack finishes it; rerunning a finished one does nothing. Ctrl-C exits 130.
    """
    import json

    from click.core import ParameterSource

    from packtool.config import PackConfig
    from packtool.formats.reader import discover
    from packtool.pipeline import run_pack
    from packtool.startup import compile_note

    if len(paths) < 2:
        raise click.UsageError("give at least one INPUT and an OUTPUT directory")
    if (ray_address is not None and engine != Engine.RAY.value
            and ctx.get_parameter_source("ray_address") is ParameterSource.COMMANDLINE):
        raise click.UsageError("--ray-address applies only with --engine ray")
    cfg = PackConfig(inputs=tuple(paths[:-1]), output=paths[-1], capacity=capacity,
                     column=column, strategy=strategy, overflow=overflow, labels=labels,
                     pad_id=pad_id, append_eos=append_eos, prepend_bos=prepend_bos,
                     attention_mask_column=attention_mask_column, labels_column=labels_column,
                     seed=seed, shuffle=not no_shuffle,
                     rows_per_shard=rows_per_shard, row_group_mb=row_group_mb,
                     workers=(os.cpu_count() or 1) if workers is None else workers,
                     overwrite=overwrite, window_docs=window_docs, engine=engine,
                     ray_address=ray_address if engine == Engine.RAY.value else None,
                     holdout=holdout, holdout_output=holdout_output)
    # what discovery skipped on purpose is part of the summary (the pack walks INPUT again)
    skipped = "" if quiet else discover(cfg.inputs).skipped_note()
    note = compile_note() if sys.stderr.isatty() else None
    if note:
        click.echo(note, err=True)
    try:
        result = run_pack(cfg, progress=not quiet)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: {cfg.output} has no manifest (as before the run, or "
                          "resumable: finished windows and shards are kept); rerun the same "
                          "command to resume and finish it") from None
    s = result.stats
    if not result.already_complete:  # once, on stderr, loud whatever the output format
        for w in result.warnings:
            click.echo(f"WARNING: {w}", err=True)
    if as_json:
        click.echo(json.dumps({"stats": s.to_dict(), "seconds": result.seconds,
                               "shards_reused": result.shards_reused,
                               "windows_reused": result.windows_reused,
                               "inputs_skipped": skipped,
                               "already_complete": result.already_complete,
                               "warnings": result.warnings,
                               **_holdout_json(cfg, result)}, indent=2))
    elif result.already_complete:
        click.echo(f"{cfg.output}: already holds this pack (same inputs, options and versions); "
                   "nothing to do")
    elif not quiet:
        rate = s.tokens_in / result.seconds if result.seconds else 0.0
        click.echo(
            f"packed {s.docs_in - s.docs_other_split:,} documents ({s.tokens_in:,} tokens in, "
            f"{s.rows * s.capacity - s.padding_tokens:,} packed) into {s.rows:,} rows of "
            f"{s.capacity} in {len(result.manifest['outputs'])} shard(s) -> {cfg.output}\n"
            f"  fill {100 * s.fill:.2f}%  padding {s.padding_tokens:,} tokens "
            f"({100 * s.padding_fraction:.2f}%)  extra rows over ceil(tokens/C): {s.extra_rows}\n"
            f"  effective targets {s.effective_targets:,} ({s.targets_per_token:.4f} per token)  "
            f"segments {s.segments:,}\n"
            f"  empty skipped {s.docs_empty:,}  cut across segments {s.docs_cut:,}  split "
            f"{s.docs_split:,} (+{s.split_fragments:,} pieces)  truncated {s.docs_truncated:,} "
            f"(-{s.tokens_truncated:,} tokens)  "
            f"dropped {s.docs_dropped:,} (-{s.tokens_dropped:,} tokens)\n"
            f"  {result.seconds:.2f} s ({cfg.engine.value} engine, start-up included), "
            f"{rate / 1e6:.2f} M tokens/s"
            + (f", {result.shards_reused} shard(s) reused" if result.shards_reused else "")
            + (f", {result.windows_reused} window(s) reused" if result.windows_reused else "")
            + (f"\n  INPUT: {skipped}" if skipped else "")
            + (f"\n  {_mask_note(s)}" if _mask_note(s) else ""))
        if "windows" in result.manifest:
            # extra rows over ceil(tokens/C) = packing inside each window (rows over the
            # window's own bound) + rounding each window's tokens up to whole rows
            ws = result.manifest["windows"]
            extra = [w["extra_rows"] for w in ws]
            docs = [w["docs"] for w in ws]
            rounding = sum(w["lower_bound_rows"] for w in ws) - s.lower_bound_rows
            click.echo(f"  windows {len(ws):,} of {min(docs):,}..{max(docs):,} documents "
                       f"(--window-docs {cfg.window_docs:,}): extra rows {s.extra_rows:,} = "
                       f"{sum(extra):,} from packing within windows (max {max(extra, default=0):,} "
                       f"in one) + {rounding:,} from rounding each window up to whole rows")
    if result.holdout is not None and not quiet and not as_json:
        h = result.holdout.stats
        click.echo(f"held out {s.docs_other_split:,} documents ({s.tokens_other_split:,} tokens) "
                   f"of --holdout {cfg.holdout} into {h.rows:,} rows of {h.capacity} -> "
                   f"{cfg.holdout_output}"
                   + (" (already complete)" if result.holdout.already_complete else ""))


def _holdout_json(cfg, result) -> dict:
    """The held-out pack's part of ``pack --json`` (nothing without --holdout)."""
    h = result.holdout
    if h is None:
        return {}
    return {"holdout": {"output": cfg.holdout_output, "stats": h.stats.to_dict(),
                        "seconds": h.seconds, "already_complete": h.already_complete}}


#: suffixes --plot accepts; matplotlib picks the format from it
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
#: rows --per-bin lists unless --per-bin-limit says otherwise
DEFAULT_PER_BIN_LIMIT = 50


def _plot_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Check --plot before any work: a known image suffix and an existing directory."""
    from pathlib import Path

    from packtool.errors import ConfigError

    if value is None:
        return None
    p = Path(value)
    if p.is_dir():
        raise ConfigError(f"--plot {value}: is a directory; give a file name such as "
                          f"{p / 'stats.png'}")
    if p.suffix.lower() not in PLOT_SUFFIXES:
        raise ConfigError(f"--plot {value}: the file name must end in "
                          f"{', '.join(PLOT_SUFFIXES)} (the image format is taken from it)")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"--plot {value}: directory {parent} does not exist; create it or "
                          "choose another path")
    return value


def _none(value: str) -> str | None:
    return None if value.lower() == "none" else value


def _mask_note(s) -> str:
    """One summary line on token masks and BOS/EOS (empty when none was in effect)."""
    parts = []
    if s.tokens_attention_masked:
        parts.append(f"attention mask removed {s.tokens_attention_masked:,} tokens")
    if s.tokens_label_masked:
        parts.append(f"input labels -100 kept {s.tokens_label_masked:,} tokens out of the "
                     "targets")
    for what, added, present in (("BOS", s.docs_bos_added, s.docs_bos_present),
                                 ("EOS", s.docs_eos_added, s.docs_eos_present)):
        if added or present:
            parts.append(f"{what} added to {added:,} documents ({present:,} had it already)")
    return "masks: " + "; ".join(parts) if parts else ""


@cli.command()
@click.argument("path", type=_ExistingPath(), metavar="PATH...", nargs=-1, required=True)
@click.option("--capacity", "-c", type=int, default=None, metavar="C",
              help="With --compare: tokens per row of the dry run.")
@click.option("--compare", is_flag=True,
              help="PATH is raw tokenized input: dry-run concat, ordered and obfd side by side.")
@click.option("--column", default="input_ids", show_default=True, metavar="NAME",
              help="With --compare: token column of the input.")
@click.option("--overflow", type=_choice(Overflow), default="split", show_default=True,
              help="With --compare: long-document policy of the dry run.")
@click.option("--append-eos", type=int, default=None, metavar="ID",
              help="With --compare: as pack --append-eos.")
@click.option("--prepend-bos", type=int, default=None, metavar="ID",
              help="With --compare: as pack --prepend-bos.")
@click.option("--attention-mask-column", default="auto", show_default=True, metavar="NAME",
              help="With --compare: as pack --attention-mask-column.")
@click.option("--labels-column", default="auto", show_default=True, metavar="NAME",
              help="With --compare: as pack --labels-column.")
@click.option("--per-bin", is_flag=True,
              help="List targets per row and per segment (packed output only).")
@click.option("--per-bin-limit", type=click.IntRange(min=0), default=None, metavar="N",
              help=f"With --per-bin: list the first N rows (0 = all) [default: "
                   f"{DEFAULT_PER_BIN_LIMIT}]; totals always cover every row.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--plot", default=None, metavar="FILE.png", callback=_plot_path,
              help="Write the figures as an image (.png, .svg or .pdf; needs matplotlib): fill "
                   "and segment lengths, or with --compare the strategies side by side.")
@click.pass_context
def stats(ctx, path, capacity, compare, column, overflow, append_eos, prepend_bos,
          attention_mask_column, labels_column, per_bin, per_bin_limit, as_json, plot):
    """Figures of a packed OUTPUT (recounted from the shards, checked against the manifest), or,
    with --capacity C --compare, a dry run of every strategy on raw INPUT lengths.

    Exits 1 when the recount disagrees with the manifest.
    """
    import json
    from pathlib import Path

    from packtool import analysis
    from packtool.errors import ConfigError, ManifestError
    from packtool.formats.manifest import MANIFEST_NAME, manifest_kind

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT

    if per_bin_limit is not None and not per_bin:
        raise ConfigError("--per-bin-limit applies with --per-bin only")
    if plot:
        analysis.require_matplotlib()  # before the work, not after it
    if compare:
        if per_bin:
            raise ConfigError("--per-bin lists the rows of a packed output; a --compare dry "
                              "run writes no rows (pack, then run packtool stats OUTPUT "
                              "--per-bin)")
        if capacity is None:
            raise ConfigError("--compare needs --capacity C")
        packed = [p for p in path if manifest_kind(p) == "packed"]
        if packed:
            raise ManifestError(f"{packed[0]}: is a packed output; --compare takes raw tokenized "
                                "input (drop --compare to see this output's figures)")
        docs = analysis.input_documents(
            path, column, attention_mask=_none(attention_mask_column),
            labels=_none(labels_column), bos=prepend_bos, eos=append_eos)
        lengths = docs.lengths
        rows = analysis.compare_strategies(lengths, capacity, overflow=overflow,
                                           targets=docs.targets)
        if as_json:
            click.echo(json.dumps({"capacity": capacity, "documents": int(lengths.size),
                                   "tokens": int(lengths.sum()), "strategies": rows}, indent=2))
        else:
            click.echo(analysis.format_compare(rows, capacity, int(lengths.size),
                                               int(lengths.sum())))
        if plot:
            analysis.plot_compare(lengths, capacity, plot, overflow=overflow)
            if not as_json:
                click.echo(f"wrote {plot}")
        return
    for name in ("column", "overflow", "append_eos", "prepend_bos", "attention_mask_column",
                 "labels_column"):
        if given(name):
            raise ConfigError(f"--{name.replace('_', '-')} applies to --compare only: a "
                              "packed output records its own")
    if len(path) != 1:
        raise ConfigError("give one packed OUTPUT directory (or raw input with --capacity C "
                          "--compare)")
    if capacity is not None:
        raise ConfigError("--capacity applies to --compare only: a packed output records "
                          "its own capacity")
    out = Path(path[0])
    if out.is_dir() and not (out / MANIFEST_NAME).exists() and any(out.rglob("*.parquet")) \
            and not any(out.glob(".packtool-*")):
        raise ManifestError(f"{out}: no {MANIFEST_NAME}, so not a packed output; for raw "
                            f"tokenized input run: packtool stats {out} --capacity C --compare")
    limit = DEFAULT_PER_BIN_LIMIT if per_bin_limit is None else per_bin_limit
    a = analysis.analyze_packed(out, per_bin=per_bin, per_bin_limit=limit or None)
    click.echo(json.dumps(a.to_dict(), indent=2) if as_json else analysis.format_packed(a))
    if plot:
        analysis.plot_packed(a, plot)
        if not as_json:
            click.echo(f"wrote {plot}")
    if a.mismatches:
        k, (rc, m) = next(iter(a.mismatches.items()))
        raise PacktoolError(f"{path[0]}: recounted {k} {rc} differs from the manifest's {m}; "
                            "the shards were changed after packing: rerun the same packtool pack "
                            "with --overwrite")


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(), metavar="INPUT... OUTPUT")
@click.option("--tokenizer", required=True, metavar="FILE",
              help="Local tokenizer file: a Hugging Face tokenizer.json, a Tekken JSON "
                   "(mistral-common) or a tiktoken BPE file (never downloaded).")
@click.option("--text-column", default="text", show_default=True, metavar="NAME",
              help="Column (JSON Lines: key) holding the text.")
@click.option("--append-eos", default=None, metavar="ID|TOKEN",
              help="Append this end-of-document token (an id, or a special token such as "
                   "'</s>') to every document not already ending with it.")
@click.option("--prepend-bos", default=None, metavar="ID|TOKEN",
              help="Prepend this beginning-of-document token likewise.")
@click.option("--add-special-tokens", is_flag=True,
              help="tokenizer.json only: apply the tokenizer's post-processor (its template's "
                   "BOS/EOS).")
@click.option("--tokenizer-pattern", default=None, metavar="REGEX",
              help="Pre-tokenization regex of a tiktoken BPE file not named after a tiktoken "
                   "encoding (o200k_base, cl100k_base, p50k_base, r50k_base).")
@click.option("--batch-docs", type=click.IntRange(min=1), default=1024, show_default=True,
              metavar="N", help="Documents encoded at a time (one Parquet row group).")
@click.option("--rows-per-shard", type=click.IntRange(min=1), default=100_000,
              show_default=True, metavar="N",
              help="Documents per output shard; a rerun after a crash keeps finished shards.")
@click.option("--workers", "-j", type=click.IntRange(min=1), default=None, metavar="N",
              help="Encoding threads [default: all cores].")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUTPUT.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def tokenize(paths, tokenizer, text_column, append_eos, prepend_bos, add_special_tokens,
             tokenizer_pattern, batch_docs, rows_per_shard, workers, overwrite, quiet, as_json):
    """Tokenize text INPUT files or directories (Parquet, Arrow, JSON Lines; paths or URIs)
    into the tokenized Parquet OUTPUT that packtool pack reads.

    One document per row or line, tokens in input_ids (list<int32>), in input order. Rerunning
    an interrupted tokenize finishes it; rerunning a finished one does nothing.
    """
    import json

    from packtool.config import TokenizeConfig
    from packtool.text.run import run_tokenize

    if len(paths) < 2:
        raise click.UsageError("give at least one INPUT and an OUTPUT directory")
    cfg = TokenizeConfig(inputs=tuple(paths[:-1]), output=paths[-1], tokenizer=tokenizer,
                         text_column=text_column, append_eos=append_eos,
                         prepend_bos=prepend_bos, add_special_tokens=add_special_tokens,
                         tokenizer_pattern=tokenizer_pattern, batch_docs=batch_docs,
                         rows_per_shard=rows_per_shard,
                         workers=(os.cpu_count() or 1) if workers is None else workers,
                         overwrite=overwrite)
    try:
        res = run_tokenize(cfg, progress=not quiet)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: {cfg.output} has no manifest (finished shards are "
                          "kept); rerun the same command to resume and finish it") from None
    if as_json:
        click.echo(json.dumps({"documents": res.documents, "tokens": res.tokens,
                               "shards": res.shards, "shards_reused": res.shards_reused,
                               "seconds": res.seconds,
                               "already_complete": res.already_complete}, indent=2))
    elif res.already_complete:
        click.echo(f"{cfg.output}: already holds this tokenization; nothing to do")
    elif not quiet:
        rate = res.tokens / res.seconds if res.seconds else 0.0
        click.echo(f"tokenized {res.documents:,} documents into {res.tokens:,} tokens in "
                   f"{res.shards} shard(s) -> {cfg.output}\n"
                   f"  {res.seconds:.2f} s, {rate / 1e6:.2f} M tokens/s"
                   + (f", {res.shards_reused} shard(s) reused" if res.shards_reused else "")
                   + (f"\n  EOS added to {res.eos_added:,} documents" if res.eos_added else "")
                   + (f"\n  BOS added to {res.bos_added:,} documents" if res.bos_added else ""))


@cli.command()
@click.argument("output", type=_ExistingPath(), metavar="OUTPUT")
@click.argument("dest", type=click.Path(), metavar="DEST")
@click.option("--to", "target", type=click.Choice(["nemo"]), required=True,
              help="nemo: the packed Parquet of NeMo / Megatron-Bridge "
                   "(GPTSFTPackedParquetDataset: input_ids, loss_mask, seq_start_id).")
@click.option("--split", type=click.Choice(["training", "validation"]), default="training",
              show_default=True, help="Names the file DEST/SPLIT_C.idx.parquet (a --holdout "
                                      "output is the validation split).")
@click.option("--overwrite", is_flag=True, help="Replace the file if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def export(output, dest, target, split, overwrite, as_json):
    """Write the packed rows of OUTPUT in another trainer's packed format, into DEST.

    With --to nemo: DEST/SPLIT_C.idx.parquet (the packtool rows, padding dropped, one sequence
    per segment, loss_mask carrying the labels; 500 rows per row group) and its entry in
    DEST/C_metadata.jsonl, the layout NeMo and Megatron-Bridge train from.
    """
    import dataclasses
    import json

    from packtool.formats.nemo import export_nemo

    res = export_nemo(output, dest, split=split, overwrite=overwrite)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(res), indent=2))
    else:
        click.echo(f"exported {res.rows:,} rows ({res.sequences:,} sequences, {res.tokens:,} "
                   f"tokens, {res.targets:,} loss-mask targets) -> {res.path}")


_BACKENDS = ("sdpa", "flex", "varlen", "flash", "hf")


@cli.command()
@click.argument("output", type=_ExistingPath(), metavar="OUTPUT")
@click.option("--rows", type=click.IntRange(min=0), default=None, metavar="N",
              help="Rows run through the models, spread over all shards, drawn from rows that "
                   "hold two documents or more [default: 8; 0 = all].")
@click.option("--scan/--no-scan", "scan_all", default=True, show_default=True,
              help="Check the columns of every row (NumPy only); --no-scan checks only the "
                   "sampled rows (and looks for one row holding two documents if none does).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the row sample and the test models.")
@click.option("--backend", "backends", multiple=True, type=click.Choice(_BACKENDS),
              help="Attention backend to check (repeatable); each one named must run and pass "
                   "[default: every backend that can run here; the others are listed as "
                   "skipped].")
@click.option("--check", "checks", multiple=True, metavar="NAME",
              help="Report only these checks (repeatable): logits_match, isolation, "
                   "loss_denominator, grad_zero_ignored, grad_zero_padding, finite, or a column "
                   "check (cu_seqlens, segment_ids, position_ids, max_seqlen, doc_ids, labels, "
                   "num_targets) [default: all].")
@click.option("--data-only", is_flag=True,
              help="Check the columns only (NumPy; torch not needed); no attention check is "
                   "asked for.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Device of sdpa, flex and hf (varlen and flash always "
                                      "run on CUDA).")
@click.option("--max-memory", default=None, metavar="SIZE",
              help="Memory for model passes, e.g. 4G [default: half of the available memory, "
                   "at most 1G]; batches and attention blocks are sized to fit.")
@click.option("--batch-size", type=click.IntRange(min=1), default=4, show_default=True,
              metavar="B", help="Most rows per forward pass (fewer when the memory budget "
                                "says so).")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="Run FlexAttention through torch.compile [default: on CUDA, and on CPU from "
                   "C = 2048 up].")
@click.option("--progress/--no-progress", default=None,
              help="A progress line per backend and batch on stderr [default: on, off with "
                   "--json].")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(output, rows, seed, backends, checks, data_only, device, max_memory, batch_size,
           compile_, progress, as_json, scan_all):
    """Prove that packed rows of OUTPUT compute what separate documents compute.

    Checks the column contract of every row, then runs a small seeded decoder (and a tiny random
    Hugging Face Llama) on sampled rows with each attention backend and compares with
    per-document forwards: logits, isolation, the loss denominator, gradients at ignored
    positions and padding, finiteness. Exit 0 only when every requested check ran and passed
    and an attention check ran on a row holding two or more documents (or --data-only); a
    0-row output, a skipped requested backend, or a failed check exit 1 saying why.
    """
    import json

    from packtool.errors import ConfigError
    from packtool.verify.checks import run_verify

    budget = None
    if max_memory is not None:
        from packtool.verify.runners import memory_budget, parse_size

        try:
            budget = parse_size(max_memory)
            memory_budget(budget)  # a budget too small is refused before any work
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--max-memory") from None
    if data_only and backends:
        raise click.UsageError("--data-only runs no backend; drop --backend")
    show = (not as_json) if progress is None else progress
    try:
        report = run_verify(output, rows=rows, seed=seed, backends=backends or None,
                            checks=checks or None, batch_size=batch_size, compile=compile_,
                            scan_all=scan_all, data_only=data_only, device=device,
                            max_memory=budget,
                            progress=(lambda m: click.echo(m, err=True)) if show else None)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.format_text())
    if not report.ok:
        raise PacktoolError(report.first_failure_message())


def main() -> None:
    """Console entry point (see :func:`packtool.__main__.main`, which also handles an early
    Ctrl-C)."""
    cli(prog_name="packtool")
