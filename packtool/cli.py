"""The ``packtool`` command line: thin wrappers that parse options, build a config and call one
function. Errors raised on purpose (:class:`PacktoolError`) become one line and exit status 1;
usage errors are click's (exit 2); ``--debug`` shows the traceback instead."""

from __future__ import annotations

import logging
import os
import sys

import click

from packtool import __version__
from packtool.errors import PacktoolError
from packtool.types import Engine, LabelMode, Overflow, Strategy

__all__ = ["cli", "main"]


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PacktoolError as exc:
            if ctx.meta.get("packtool.debug"):
                raise
            raise click.ClickException(str(exc)) from None


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
              help="Append this end-of-document id to every document before packing.")
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
@click.option("--quiet", "-q", is_flag=True, help="No progress bars and no summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def pack(ctx, paths, capacity, column, strategy, overflow, labels, pad_id, append_eos, seed,
         no_shuffle, rows_per_shard, row_group_mb, workers, overwrite, window_docs, engine,
         ray_address, quiet, as_json):
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
    from packtool.signals import EXIT_INTERRUPTED
    from packtool.startup import compile_note

    if len(paths) < 2:
        raise click.UsageError("give at least one INPUT and an OUTPUT directory")
    if (ray_address is not None and engine != Engine.RAY.value
            and ctx.get_parameter_source("ray_address") is ParameterSource.COMMANDLINE):
        raise click.UsageError("--ray-address applies only with --engine ray")
    cfg = PackConfig(inputs=tuple(paths[:-1]), output=paths[-1], capacity=capacity,
                     column=column, strategy=strategy, overflow=overflow, labels=labels,
                     pad_id=pad_id, append_eos=append_eos, seed=seed, shuffle=not no_shuffle,
                     rows_per_shard=rows_per_shard, row_group_mb=row_group_mb,
                     workers=(os.cpu_count() or 1) if workers is None else workers,
                     overwrite=overwrite, window_docs=window_docs, engine=engine,
                     ray_address=ray_address if engine == Engine.RAY.value else None)
    # what discovery skipped on purpose is part of the summary (the pack walks INPUT again)
    skipped = "" if quiet else discover(cfg.inputs).skipped_note()
    note = compile_note() if sys.stderr.isatty() else None
    if note:
        click.echo(note, err=True)
    try:
        result = run_pack(cfg, progress=not quiet)
    except KeyboardInterrupt:
        click.echo(f"Error: interrupted: {cfg.output} has no manifest (as before the run, "
                   "or resumable); rerun the same command to finish it", err=True)
        ctx.exit(EXIT_INTERRUPTED)
    s = result.stats
    for w in result.warnings:  # loud, whatever the output format
        click.echo(f"WARNING: {w}", err=True)
    if as_json:
        click.echo(json.dumps({"stats": s.to_dict(), "seconds": result.seconds,
                               "shards_reused": result.shards_reused,
                               "inputs_skipped": skipped,
                               "already_complete": result.already_complete,
                               "warnings": result.warnings}, indent=2))
    elif result.already_complete:
        click.echo(f"{cfg.output}: already holds this pack (same inputs, options and versions); "
                   "nothing to do")
    elif not quiet:
        rate = s.tokens_in / result.seconds if result.seconds else 0.0
        click.echo(
            f"packed {s.docs_in:,} documents ({s.tokens_in:,} tokens) into {s.rows:,} rows of "
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
            + (f"\n  INPUT: {skipped}" if skipped else ""))
        if "windows" in result.manifest:
            ws = result.manifest["windows"]
            extra = [w["extra_rows"] for w in ws]
            docs = [w["docs"] for w in ws]
            click.echo(f"  windows {len(ws):,} of {min(docs):,}..{max(docs):,} documents "
                       f"(--window-docs {cfg.window_docs:,}): extra rows per window max "
                       f"{max(extra, default=0)}, sum {sum(extra)}; total extra over the "
                       f"global bound {s.extra_rows}")
        for w in result.warnings:
            click.echo(f"  WARNING: {w}")


@cli.command()
@click.argument("path", type=click.Path(exists=True), metavar="PATH...", nargs=-1, required=True)
@click.option("--capacity", "-c", type=int, default=None, metavar="C",
              help="With --compare: tokens per row of the dry run.")
@click.option("--compare", is_flag=True,
              help="PATH is raw tokenized input: dry-run concat, ordered and obfd side by side.")
@click.option("--column", default="input_ids", show_default=True, metavar="NAME",
              help="With --compare: token column of the input.")
@click.option("--overflow", type=_choice(Overflow), default="split", show_default=True,
              help="With --compare: long-document policy of the dry run.")
@click.option("--per-bin", is_flag=True, help="List targets per row and per segment.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, metavar="FILE.png",
              help="Write fill and length histograms (needs matplotlib).")
def stats(path, capacity, compare, column, overflow, per_bin, as_json, plot):
    """Figures of a packed OUTPUT (recounted from the shards, checked against the manifest), or,
    with --capacity C --compare, a dry run of every strategy on raw INPUT lengths.

    Exits 1 when the recount disagrees with the manifest.
    """
    import json

    from packtool import analysis

    from pathlib import Path

    from packtool.errors import ManifestError
    from packtool.formats.manifest import MANIFEST_NAME

    if compare:
        if capacity is None:
            raise click.UsageError("--compare needs --capacity C")
        packed = [p for p in path if (Path(p) / MANIFEST_NAME).is_file()]
        if packed:
            raise ManifestError(f"{packed[0]}: is a packed output; --compare takes raw tokenized "
                                "input (drop --compare to see this output's figures)")
        lengths = analysis.input_lengths(path, column)
        rows = analysis.compare_strategies(lengths, capacity, overflow=overflow)
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
    if len(path) != 1:
        raise click.UsageError("give one packed OUTPUT directory (or use --compare)")
    if capacity is not None:
        raise click.UsageError("--capacity applies to --compare only: a packed output records "
                               "its own capacity")
    out = Path(path[0])
    if out.is_dir() and not (out / MANIFEST_NAME).exists() and any(out.rglob("*.parquet")) \
            and not any(out.glob(".packtool-*")):
        raise ManifestError(f"{out}: no {MANIFEST_NAME}, so not a packed output; for raw "
                            f"tokenized input run: packtool stats {out} --capacity C --compare")
    a = analysis.analyze_packed(out, per_bin=per_bin)
    click.echo(json.dumps(a.to_dict(), indent=2) if as_json else analysis.format_packed(a))
    if plot:
        analysis.plot_packed(a, plot)
        if not as_json:
            click.echo(f"wrote {plot}")
    if a.mismatches:
        k, (rc, m) = next(iter(a.mismatches.items()))
        raise PacktoolError(f"{path[0]}: recounted {k} {rc} differs from the manifest's {m}; "
                            "the shards were changed after packing: rerun packtool pack")


@cli.command()
@click.argument("output", type=click.Path(exists=True, file_okay=False), metavar="OUTPUT")
@click.option("--rows", type=int, default=None, metavar="N",
              help="Rows run through the models, spread over all shards, drawn from rows that "
                   "hold two documents or more [default: 8; 0 = all].")
@click.option("--scan/--no-scan", "scan_all", default=True, show_default=True,
              help="Check the columns of every row (NumPy only); --no-scan checks only the "
                   "sampled rows.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the row sample and the test models.")
@click.option("--backend", "backends", multiple=True,
              type=click.Choice(["sdpa", "flex", "varlen", "flash", "hf"]),
              help="Attention backend to check (repeatable) [default: all; those that cannot "
                   "run here are reported as skipped].")
@click.option("--batch-size", type=int, default=4, show_default=True, metavar="B",
              help="Rows per forward pass.")
@click.option("--compile", "compile_", is_flag=True,
              help="Run FlexAttention through torch.compile.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(output, rows, seed, backends, batch_size, compile_, as_json, scan_all):
    """Prove that packed rows of OUTPUT compute what separate documents compute.

    Runs a small seeded decoder (and a tiny random Hugging Face Llama) on sampled rows with each
    attention backend and compares with per-document forwards: logits, isolation, labels, the
    loss denominator, gradients at ignored positions, finiteness. Exit 0 only when every check
    that ran passed; otherwise exit 1 naming shard, row, segment and check.
    """
    import json

    from packtool.verify.checks import ALL_BACKENDS, run_verify

    report = run_verify(output, rows=rows, seed=seed, backends=backends or ALL_BACKENDS,
                        batch_size=batch_size, compile=compile_, scan_all=scan_all)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.format_text())
    if report.failures:
        raise PacktoolError(report.first_failure_message())
    if not report.ok:
        raise PacktoolError("verify ran no check (every backend skipped)")


def main() -> None:
    """Console entry point (see :func:`packtool.__main__.main`, which also handles an early
    Ctrl-C)."""
    cli(prog_name="packtool")
