"""The ``packtool`` command line: thin wrappers that parse options, build a config and call one
function.

One exit-status rule for every command (:mod:`packtool.errors`): 0 success; 1 bad input or
output data, a failed check or a missing dependency; 2 a command line that cannot run (click's
usage errors and :class:`~packtool.errors.ConfigError`); 130 interrupted (Ctrl-C), 143 stopped
by SIGTERM (a batch scheduler; the same clean stop). Every error is one ``Error: ...`` line on
stderr; ``packtool --debug CMD ...`` shows the traceback instead.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys

import click

from packtool._version import __version__
from packtool.errors import EXIT_DATA, InputError, Interrupted, PacktoolError, shortage_error
from packtool.location import display
from packtool.types import DEFAULT_TOKEN_COLUMN, Engine, LabelMode, Overflow, Strategy

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
            from packtool.signals import exit_status, stop_word

            raise _Failure(stop_word(), exit_status()) from None
        except Exception as exc:
            if ctx.meta.get("packtool.debug"):
                raise
            raise _failure_of(exc, ctx.invoked_subcommand) from None


def _failure_of(exc: Exception, command: str | None) -> _Failure:
    """The one line of an exception no layer turned into a :class:`PacktoolError`: a machine
    running short (memory, open files: never "internal error"), an I/O failure (disk full,
    permissions), or a bug (how to see more)."""
    workers = command in ("pack", "tokenize")  # the commands that run tasks side by side
    short = shortage_error(exc, memory="or fewer --workers" if workers else "",
                           files="use fewer --workers" if workers else "")
    if short is not None:
        return _Failure(str(short), short.exit_code)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        if isinstance(exc, PermissionError):  # the fix, as discovery words it for INPUT
            return _Failure(f"{where}permission denied: fix its permissions (packtool must "
                            "read or write it), or run as a user allowed to", EXIT_DATA)
        return _Failure(f"{where}{exc.strerror or exc}", EXIT_DATA)
    return _Failure(f"internal error ({type(exc).__name__}: {exc}); rerun as "
                    f"`packtool --debug {command or ''} ...` for the traceback and report it",
                    EXIT_DATA)


class _ExistingPath(click.Path):
    """A local path that must exist; a missing one is an input error (exit 1) in every command,
    not a usage error. A URI (``s3://bucket/key``) is passed on as given: the reader looks it up
    in its filesystem and names it when it is missing. ``packed_output``: the argument is one
    OUTPUT of ``packtool pack`` (a quoted pattern's fix then says so:
    :meth:`packtool.location.Location.missing_fix`)."""

    def __init__(self, *, packed_output: bool = False):
        # not click's readability check (a usage error of three lines): the reader refuses an
        # unreadable path in its one line (permission denied: fix its permissions ...)
        super().__init__(readable=False)
        self.packed_output = packed_output

    def convert(self, value, param, ctx):
        from packtool.location import Location

        loc = Location.parse(value)
        if not loc.is_local:
            return value
        value = str(loc)  # a file: URI is its local path
        if not os.path.lexists(value):
            fix = loc.missing_fix("check the path", packed_output=self.packed_output)
            raise InputError(f"{value}: {loc.missing()}; {fix}")
        return super().convert(value, param, ctx)


def _new_folder(value, what: str) -> None:
    """Refuse a folder to be created whose name is that of a data file (``part-0001.parquet``,
    ``docs.jsonl.gz``: :func:`~packtool.formats.reader.data_file_suffix`) and that does not
    exist: most likely a mistyped INPUT file taken as the last positional, which would pack
    the other inputs alone into a new folder of that name. Given with a trailing slash
    (``x.parquet/``, a Spark-style folder) it is taken as asked; an existing entry is left to
    the command (a folder of that name is fine). Local paths only (a store prefix is not
    listed for this).

    Raises:
        click.UsageError: one line naming ``value`` and the two fixes.
    """
    from packtool.formats.reader import data_file_suffix
    from packtool.location import Location

    text = os.fspath(value)
    if text.endswith(("/", os.sep)) or not Location.parse(text).is_local:
        return
    suffix = data_file_suffix(text)
    if suffix is None or os.path.lexists(text):
        return
    raise click.UsageError(f"{what} {text}: does not exist and its name ends in {suffix}, so "
                           f"it looks like a mistyped INPUT file; check the INPUT names, or to "
                           f"create a folder of that name pass it with a trailing slash: "
                           f"{shlex.quote(text + '/')}")


def _early_stop_words(outputs) -> None:
    """Until the run enters its ``outputs`` (``(path, role)`` pairs), a Ctrl-C or SIGTERM ends
    the command at once (:func:`packtool.signals.install_early_handler`): its line says what
    they hold when one keeps what a stopped run left for its rerun (:func:`packtool.output.untouched_words`),
    not "nothing was written", which reads as if that work were gone."""
    from packtool.output import held_words, untouched_words
    from packtool.signals import early_words, test_pause

    from packtool.location import Location

    held = any(held_words(path) for path, _role in outputs)
    # a store output is not listed for a message: it may hold a stopped run's work all the same
    store = any(not Location.parse(path).is_local for path, _role in outputs)
    early_words("; ".join(untouched_words(path) for path, _role in outputs)
                + "; rerun the same command to resume and finish it" if held else
                "nothing was written: " + "; ".join(untouched_words(path)
                                                    for path, _role in outputs)
                if store else None)
    test_pause("start")


class _TokenId(click.ParamType):
    """A token id (an integer) of ``pack`` and ``compare``; a token string (``'</s>'``) is
    refused saying that ``packtool tokenize`` takes those (it has the tokenizer to look them
    up)."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return int(value)
        except ValueError:
            flag = param.opts[0] if param is not None else "--append-eos"
            self.fail(f"{value!r}: this command takes a token id (an integer such as 2); a "
                      f"token string is looked up by packtool tokenize {flag} {value!r} "
                      "--tokenizer FILE, which has the tokenizer", param, ctx)


def _choice(enum) -> click.Choice:
    return click.Choice([e.value for e in enum])


@click.group(cls=_Group, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="packtool")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug logs).")
@click.pass_context
def cli(ctx: click.Context, debug: bool, verbose: int) -> None:
    """Pack tokenized documents into fixed-capacity rows for document-masked LLM training."""
    if ctx.invoked_subcommand is None:  # bare packtool: the help, as asked for (exit 0)
        click.echo(ctx.get_help(), color=ctx.color)
        ctx.exit(0)
    ctx.meta["packtool.debug"] = debug
    level = logging.WARNING - 10 * min(verbose, 2)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogFormat("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


@cli.command("help")
@click.argument("command", required=False, metavar="[COMMAND]")
@click.pass_context
def help_(ctx: click.Context, command: str | None) -> None:
    """Show the help of packtool, or of COMMAND (as COMMAND --help)."""
    top = ctx.parent
    if command is None:
        click.echo(top.get_help(), color=ctx.color)
        return
    name, cmd, _ = top.command.resolve_command(top, [command])  # unknown: click's usage error
    click.echo(click.Context(cmd, info_name=name, parent=top).get_help(), color=ctx.color)


class _LogFormat(logging.Formatter):
    """Warnings as the summary writes them (``WARNING: ...``); -v / -vv logs with their
    level and logger (``INFO packtool.pipeline: ...``)."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.WARNING and not record.exc_info:
            return f"{record.levelname}: {record.getMessage()}"
        return super().format(record)  # with a traceback when the record has one


def _spec(*decls, **attrs) -> tuple:
    """A click option as data (its declarations and attributes): one list of them makes the
    options of two commands (:func:`_options`), so they cannot drift apart."""
    return decls, attrs


def _options(specs, **changes):
    """A decorator adding the options ``specs`` (:func:`_spec`) in their order, each with the
    attributes ``changes`` set (``hidden=True``: a deprecated alias's)."""
    def add(f):
        for decls, attrs in reversed(specs):
            f = click.option(*decls, **{**attrs, **changes})(f)
        return f
    return add


#: options saying how INPUT is read, the same for pack and compare (one code path reads it:
#: :func:`packtool.pipeline.read.iter_documents`)
_INPUT_OPTIONS = [
    _spec("--append-eos", type=_TokenId(), default=None, metavar="ID",
          help="Append this end-of-document id to every document not already ending "
               "with it."),
    _spec("--prepend-bos", type=_TokenId(), default=None, metavar="ID",
          help="Prepend this beginning-of-document id to every document not already "
               "starting with it."),
    _spec("--attention-mask-column", default="auto", show_default=True, metavar="NAME",
          help="Input column whose 0 entries are removed before packing (padding, at a "
               "row's ends; a 0 between 1s is refused); auto: attention_mask when "
               "present; none: ignore."),
    _spec("--labels-column", default="auto", show_default=True, metavar="NAME",
          help="Input column of unshifted labels whose -100 entries (e.g. SFT prompts) "
               "stay non-targets; auto: labels when present; none: ignore."),
    _spec("--loss-mask-column", default="auto", show_default=True, metavar="NAME",
          help="Input column, 1 on the tokens to learn and 0 elsewhere (TRL's SFT "
               "masks); auto: completion_mask and assistant_masks when present; none: "
               "ignore."),
    _spec("--skip-unsupported", is_flag=True,
          help="Read the supported files of an INPUT directory and list the others in "
               "the summary [default: refuse a directory holding files of another "
               "format]."),
]


def _input_options(f):
    return _options(_INPUT_OPTIONS)(f)


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(readable=False),
              metavar="INPUT... OUTPUT")
@click.option("--capacity", "-c", type=int, default=2048, show_default=True, metavar="C",
              help="Tokens per packed row.")
@click.option("--column", default=DEFAULT_TOKEN_COLUMN, show_default=True, metavar="NAME",
              help="Token column of the input (list of integer ids).")
@click.option("--strategy", type=_choice(Strategy), default="obfd", show_default=True,
              help="obfd: best-fit-decreasing; ordered: next-fit in input order; concat: "
                   "stream cut every C tokens.")
@click.option("--overflow", type=_choice(Overflow), default="split", show_default=True,
              help="Documents longer than C: split into chunks, truncate, drop, or error.")
@click.option("--segment-multiple", type=click.IntRange(min=1), default=1, show_default=True,
              metavar="N",
              help="Pad every document piece to a multiple of N tokens inside its row (never a "
                   "target; only its own document's later padding sees it) and store "
                   "cu_seqlens_unpadded: context parallelism with TransformerEngine's THD "
                   "format takes N = 2 x cp size. C must be a multiple of N.")
@click.option("--labels", type=_choice(LabelMode), default="none", show_default=True,
              help="none: no labels column (readers derive the unshifted labels from input_ids "
                   "and segment_ids); unshifted: store them, the model shifts (Hugging Face); "
                   "shifted: store them already shifted.")
@click.option("--pad-id", type=int, default=0, show_default=True, metavar="ID",
              help="Token id written on padding.")
@click.option("--min-fill", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              metavar="FRACTION",
              help="Leave out planned rows holding fewer real tokens than FRACTION x C; their "
                   "documents and tokens are counted as dropped (1: only rows without padding).")
@click.option("--source-column", default=None, metavar="NAME",
              help="Input column (a string or integer per document: source, lang, domain) "
                   "carried into the rows as each segment's source_ids, the id -> value table "
                   "in the manifest; stats then counts per source [default: none].")
@_input_options
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the row shuffle.")
@click.option("--no-shuffle", is_flag=True, help="Keep rows in creation order.")
@click.option("--rows-per-shard", type=int, default=8192, show_default=True, metavar="N",
              help="Rows per output Parquet file.")
@click.option("--row-group-mb", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, metavar="MIB",
              help="Parquet row-group size as MiB of per-token data (one random row decodes one "
                   "row group).")
@click.option("--compression", type=click.Choice(["zstd", "lz4"]), default="zstd",
              show_default=True,
              help="Parquet codec of the shards: lz4 stores input_ids in about 45 % more bytes "
                   "and a training loader decodes them in about 0.6x the CPU.")
@click.option("--workers", "-j", type=int, default=None, metavar="N",
              help="Threads for layout and encoding [default: all cores].")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUTPUT.")
@click.option("--window-docs", type=click.IntRange(min=1), default=None, metavar="N",
              help="Plan windows of at most N documents independently, each dealt blocks of "
                   "documents from across the whole input (a few extra rows per window); rows "
                   "of all windows are mixed in the output [default: one plan over all "
                   "documents].")
@click.option("--engine", type=_choice(Engine), default="local", show_default=True,
              help="local: this process; ray: one Ray task per window (needs packtool[ray]; "
                   "--window-docs defaults to 250,000). Same bytes either way with the same "
                   "--window-docs.")
@click.option("--ray-address", default=None, metavar="ADDRESS", envvar="RAY_ADDRESS",
              show_envvar=True,
              help="Ray cluster to join with --engine ray (HOST:PORT, auto, ray://...) "
                   "[default: start a local Ray on --workers CPUs].")
@click.option("--holdout", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=None, metavar="FRACTION",
              help="Hold out this fraction of the documents (whole documents, drawn with "
                   "--seed) into a second packed output, for validation loss.")
@click.option("--holdout-output", default=None, metavar="DIR",
              help="Where the held-out documents are packed [default: OUTPUT-holdout].")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars and no summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def pack(ctx, paths, capacity, column, strategy, overflow, segment_multiple, labels, pad_id,
         min_fill, source_column, append_eos, prepend_bos, attention_mask_column, labels_column,
         loss_mask_column, skip_unsupported, seed, no_shuffle, rows_per_shard, row_group_mb,
         compression, workers, overwrite, window_docs, engine, ray_address, holdout,
         holdout_output, quiet, as_json):
    """Pack tokenized Parquet INPUT files or directories into OUTPUT.

    Writes part-NNNNN.parquet shards (input_ids, segment_ids, position_ids, [labels],
    cu_seqlens, [cu_seqlens_unpadded], max_seqlen, num_targets, doc_ids, doc_offsets,
    [source_ids]) and the manifest, last. Rerunning an interrupted pack finishes it; rerunning a
    finished one does nothing. Ctrl-C exits 130, SIGTERM 143.
    """
    import json

    from click.core import ParameterSource

    from packtool.config import PackConfig
    from packtool.formats.memory import use_jemalloc
    from packtool.formats.reader import discover, input_columns
    from packtool.pipeline import run_pack
    from packtool.startup import compile_note, release_gc

    release_gc()  # the command's imports are done (packtool/startup.py)
    use_jemalloc()  # this process's Arrow memory pool (formats/memory.py)
    if len(paths) < 2:
        raise click.UsageError("give at least one INPUT and an OUTPUT directory")
    if (ray_address is not None and engine != Engine.RAY.value
            and ctx.get_parameter_source("ray_address") is ParameterSource.COMMANDLINE):
        raise click.UsageError("--ray-address applies only with --engine ray")
    _new_folder(paths[-1], "OUTPUT")
    if holdout_output is not None:
        _new_folder(holdout_output, "--holdout-output")
    cfg = PackConfig(inputs=tuple(paths[:-1]), output=paths[-1], capacity=capacity,
                     column=column, strategy=strategy, overflow=overflow,
                     segment_multiple=segment_multiple, labels=labels, min_fill=min_fill,
                     pad_id=pad_id, append_eos=append_eos, prepend_bos=prepend_bos,
                     attention_mask_column=attention_mask_column, labels_column=labels_column,
                     loss_mask_column=loss_mask_column, seed=seed, shuffle=not no_shuffle,
                     rows_per_shard=rows_per_shard, row_group_mb=row_group_mb,
                     compression=compression,
                     workers=(os.cpu_count() or 1) if workers is None else workers,
                     overwrite=overwrite, window_docs=window_docs, engine=engine,
                     ray_address=ray_address if engine == Engine.RAY.value else None,
                     skip_unsupported=skip_unsupported, holdout=holdout,
                     holdout_output=holdout_output, source_column=source_column)
    _early_stop_words(cfg.own_outputs())
    # what discovery did not read, and mask-like columns not used, are part of the summary
    # (the pack walks INPUT again)
    summary = as_json or not quiet  # -q --json still reports what was not read
    found = discover(cfg.inputs, skip_unsupported=cfg.skip_unsupported,
                     outputs=cfg.own_outputs()) if summary else None
    skipped = found.skipped_note() if found else ""
    columns = None if not summary else input_columns(found.files, cfg.column,
                                               cfg.attention_mask_column, cfg.labels_column,
                                               cfg.loss_mask_column)
    input_notes = _input_notes(found, columns)
    note = compile_note() if sys.stderr.isatty() else None
    if note:
        click.echo(note, err=True)
    try:
        result = run_pack(cfg, progress=not quiet)
    except KeyboardInterrupt as exc:
        from packtool.signals import exit_status, stop_word

        # what each output holds now (finished, as before, or what the rerun resumes from)
        from packtool.output import NOTHING_KEPT

        held = str(exc) or f"{NOTHING_KEPT} ({display(cfg.output)} is as before the run)"
        rerun = getattr(exc, "rerun", None) or (
            "rerun the same command to resume and finish it"
            if str(exc) and getattr(exc, "kept_any", True) else
            "a rerun starts from the beginning")
        raise Interrupted(f"{stop_word()}: {held}; {rerun}", exit_status()) from None
    from packtool.stats import percent, plural  # NumPy: after the start-up hook, not at import

    s = result.stats
    # once, on stderr, loud whatever the output format (what the run logged as it went, the
    # low-space note, was said then)
    if not result.already_complete:
        for w in result.warnings:
            if w not in result.said:
                click.echo(f"WARNING: {w}", err=True)
    if result.holdout is not None and not result.holdout.already_complete:
        for w in result.holdout.warnings:
            if w not in result.holdout.said:
                click.echo(f"WARNING: held-out pack ({display(cfg.holdout_output)}): {w}",
                           err=True)
    if as_json:
        click.echo(json.dumps({"stats": s.to_dict(), "seconds": result.seconds,
                               "shards_reused": result.shards_reused,
                               "windows_reused": result.windows_reused,
                               "parts_reused": result.parts_reused,
                               "docs_reused": result.docs_reused,
                               "inputs_skipped": skipped,
                               "inputs_not_read": found.skipped if found else [],
                               "input_notes": found.notes if found else [],
                               "input_columns_unused": columns.unused if columns else {},
                               "already_complete": result.already_complete,
                               "warnings": result.warnings,
                               **({"windows": _windows_breakdown(result.manifest, s,
                                                                 cfg.window_docs)}
                                  if result.manifest.windows else {}),
                               **_holdout_json(cfg, result)}, indent=2))
    elif result.already_complete and not quiet:  # -q: nothing on success
        from packtool.formats.manifest import older_version_note

        click.echo(f"{display(cfg.output)}: already holds this pack (same inputs, options and "
                   f"versions){older_version_note(result.manifest, display(cfg.output))}; "
                   "nothing to do")
    elif not quiet:
        rate = s.tokens_in / result.seconds if result.seconds else 0.0
        concat = cfg.strategy == Strategy.CONCAT
        click.echo(
            f"packed {s.docs_written:,} of {plural(s.docs_in - s.docs_other_split, 'document')} "
            f"read ({s.real_tokens:,} of {plural(s.tokens_in, 'token')}) into "
            f"{plural(s.rows, 'row')} of {s.capacity} in "
            f"{plural(len(result.manifest.shards), 'shard')} -> {display(cfg.output)}\n"
            f"  fill {percent(s.real_tokens, s.rows * s.capacity, 2)}  padding "
            f"{plural(s.padding_tokens, 'token')} "
            f"({percent(s.padding_tokens, s.rows * s.capacity, 2)})  extra rows over "
            f"ceil(tokens/C): {s.extra_rows}\n"
            + (f"  {s.segment_padding_note(cfg.segment_multiple)}\n"
               if cfg.segment_multiple > 1 else "") +
            f"  effective targets {s.effective_targets:,} ({s.targets_per_token:.4f} per token)  "
            f"segments {s.segments:,}\n"
            f"  empty skipped {s.docs_empty:,}  cut across segments {s.docs_cut:,}  split "
            + ("none (concat cuts the stream at row ends, it splits no document)" if concat
               else f"{s.docs_split:,}" + (" in the plan" if s.rows_dropped else "")
               + f" (+{plural(s.split_fragments, 'piece')}"
               + (" written)" if s.rows_dropped else ")"))
            + f"  {_losses(s, cfg.min_fill)}\n"
            f"  {result.seconds:.2f} s ({cfg.engine.value} engine, start-up included), "
            f"{rate / 1e6:.2f} M tokens/s"
            + (f", {plural(result.shards_reused, 'shard')} reused" if result.shards_reused
               else "")
            + (f", {plural(result.docs_reused, 'document')} not read again" if result.docs_reused
               else "")
            + (f", {plural(result.windows_reused, 'window')} reused" if result.windows_reused
               else "")
            + "".join(f"\n  INPUT: {n}" for n in input_notes)
            + (f"\n  input: {s.input_note()}" if s.input_note() else ""))
        if result.manifest.windows:
            w = _windows_breakdown(result.manifest, s, cfg.window_docs)
            click.echo(f"  windows {w['windows']:,} of {w['docs_min']:,}.."
                       f"{plural(w['docs_max'], 'document')} (--window-docs {w['window_docs']}): "
                       "extra rows "
                       f"{w['extra_rows']:,} = {w['extra_rows_within']:,} from packing within "
                       f"windows (max {w['extra_rows_max']:,} in one) + "
                       f"{w['extra_rows_rounding']:,} from rounding each window up to whole rows")
    if result.holdout is not None and not quiet and not as_json:
        h = result.holdout.stats
        lost = f"; {_losses(h, cfg.min_fill)}" if h.tokens_lost else ""
        click.echo(f"held out {plural(s.docs_other_split, 'document')} "
                   f"({plural(s.tokens_other_split, 'token')}) "
                   f"of --holdout {cfg.holdout} into {plural(h.rows, 'row')} "
                   f"of {h.capacity} -> "
                   f"{display(cfg.holdout_output)}{lost}"
                   + (" (already complete)" if result.holdout.already_complete else ""))


def _losses(s, min_fill: float) -> str:
    """What a pack did not write, for its summary: every token not written
    (``tokens_dropped``), the truncated documents with their tails, the dropped documents with
    their tokens by cause (:meth:`~packtool.stats.PackStats.dropped_words`), and the rows
    ``--min-fill`` left out (when it left any)."""
    from packtool.stats import plural

    return (f"tokens dropped {s.tokens_dropped:,}: truncated "
            f"{plural(s.docs_truncated, 'document')} ({plural(s.tokens_truncated, 'token')} cut), "
            f"dropped {s.dropped_words()}"
            + (f"; --min-fill {min_fill:g}: {s.under_min_fill_words()}" if s.rows_dropped else ""))


def _holdout_json(cfg, result) -> dict:
    """The held-out pack's part of ``pack --json`` (nothing without --holdout)."""
    h = result.holdout
    if h is None:
        return {}
    return {"holdout": {"output": display(cfg.holdout_output), "stats": h.stats.to_dict(),
                        "seconds": h.seconds, "already_complete": h.already_complete,
                        "warnings": h.warnings}}


#: suffixes --plot accepts; matplotlib picks the format from it
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
#: rows --per-bin lists unless --per-bin-limit says otherwise
DEFAULT_PER_BIN_LIMIT = 50
#: sources stats lists unless --per-source-limit says otherwise
DEFAULT_PER_SOURCE_LIMIT = 50


def _row_window(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """Check --row-window before any work: 0 (whole rows) or a window of 2 tokens or more (one
    token has nothing to predict; :func:`~packtool.verify.checks.row_windows`)."""
    from packtool.errors import ConfigError

    if value is None:
        return value
    from packtool.verify.checks import row_window_ok

    if not row_window_ok(value):
        raise ConfigError(f"--row-window {value}: a window holds 2 tokens or more (0: whole "
                          "rows)")
    return value


def _plot_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Check --plot before any work: a known image suffix and an existing directory that can be
    written (a store URI: its suffix)."""
    from pathlib import Path

    from packtool.errors import ConfigError

    if value is None:
        return None
    from packtool.location import Location

    loc = Location.parse(value)
    if not loc.is_local:  # written to the store at the end: its suffix only
        if Path(loc.name).suffix.lower() not in PLOT_SUFFIXES:
            raise ConfigError(f"--plot {value}: the file name must end in "
                              f"{', '.join(PLOT_SUFFIXES)} (the image format is taken from it)")
        return value
    p = loc.path  # a file: URI is its local path
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
    import tempfile

    try:  # a directory that cannot be written (/proc, read-only) is told now, not after the work
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".packtool-plot-"):
            pass
    except OSError as exc:
        raise ConfigError(f"--plot {value}: cannot write in {parent} ({exc.strerror or exc}); "
                          "choose another path") from None
    return value


def _input_notes(found, columns) -> list[str]:
    """Summary lines on INPUT: entries not read, order notes, mask-like columns not used."""
    notes = [found.skipped_note()] if found is not None and found.skipped else []
    notes += found.notes if found is not None else []
    if columns is not None and columns.unused:
        notes.append(columns.unused_note())
    return notes


#: The BOS/EOS counts of the input (``PackStats`` fields) that ``--json`` reports.
_BOUNDARY_COUNTS = ("docs_bos_added", "docs_bos_present", "docs_eos_added", "docs_eos_present")


_PLOT_OPTION = click.option(
    "--plot", default=None, metavar="FILE.png", callback=_plot_path,
    help="Write the figures as an image (.png, .svg or .pdf; needs matplotlib).")


def _is_packed_output(path) -> bool:
    """True when ``path`` (a path or URI) is a finished output of packed rows: its manifest is
    there and does not say another kind (a ``packtool tokenize`` output is raw input)."""
    from packtool.errors import ManifestError
    from packtool.formats.manifest import MANIFEST_NAME, read_manifest
    from packtool.location import Location

    loc = Location.parse(path)
    if not loc.join(MANIFEST_NAME).is_file():
        return False
    try:
        return read_manifest(loc).is_packed
    except ManifestError:
        return True  # a manifest packtool cannot read: not raw input either


def _windows_breakdown(manifest, s, window_docs) -> dict:
    """A windowed pack's windows in figures, for its summary (text and ``--json``): ``windows``,
    ``docs_min`` / ``docs_max`` (documents a window), ``window_docs`` (the option), and the
    extra rows over ceil(tokens / C) split as packing inside each window (``extra_rows_within``:
    rows over each window's own bound, ``extra_rows_max`` the most in one) plus rounding each
    window's tokens up to whole rows (``extra_rows_rounding``)."""
    ws = manifest.windows
    extra = [w.extra_rows for w in ws]
    docs = [w.docs for w in ws]
    return {"windows": len(ws), "docs_min": min(docs), "docs_max": max(docs),
            "window_docs": window_docs, "extra_rows": s.extra_rows,
            "extra_rows_within": sum(extra), "extra_rows_max": max(extra, default=0),
            "extra_rows_rounding": sum(w.lower_bound_rows for w in ws) - s.lower_bound_rows}


def _run_compare(cfg, as_json: bool, plot: str | None) -> None:
    """The dry run of ``packtool compare`` (and of the deprecated ``stats --compare``)."""
    import json

    from packtool import analysis
    from packtool.errors import ManifestError
    from packtool.startup import release_gc

    release_gc()  # the command's imports are done (packtool/startup.py)
    if plot:
        analysis.require_matplotlib()  # before the work, not after it
    packed = [p for p in cfg.inputs if _is_packed_output(p)]
    if packed:
        raise ManifestError(f"{packed[0]}: is a packed output; compare takes raw tokenized "
                            f"input (for this output's figures run: packtool stats {packed[0]})")
    opts = cfg.read_options()
    docs = analysis.input_documents(
        cfg.inputs, cfg.column, attention_mask=opts["attention_mask"], labels=opts["labels"],
        loss_mask=opts["loss_mask"], bos=opts["bos"], eos=opts["eos"],
        skip_unsupported=cfg.skip_unsupported)
    lengths = docs.lengths
    docs.refuse_as_pack(cfg.capacity, cfg.overflow, cfg.column, cfg.window_docs)
    rows = analysis.compare_strategies(lengths, cfg.capacity, overflow=cfg.overflow,
                                       targets=docs.targets, window_docs=cfg.window_docs,
                                       min_fill=cfg.min_fill,
                                       segment_multiple=cfg.segment_multiple)
    notes = _input_notes(docs.discovery, docs.columns)
    masked = _input_mask_stats(docs)
    mask = masked.input_note()  # its own line, "input: ...", as pack's summary prints it
    # the lines pack prints with these options, each once: a line not every strategy's pack
    # prints names the strategies (and windowing) whose pack prints it, separated by "; " (a
    # windowed name holds a comma: "obfd, windows of 20,000")
    whose: dict = {}
    for r in rows:
        for w in r["warnings"]:
            whose.setdefault(w, []).append(r["strategy"])
    warnings = [w if len(names) == len(rows) else f"{'; '.join(names)}: {w}"
                for w, names in whose.items()]
    for w in warnings:
        click.echo(f"WARNING: {w}", err=True)
    tokens = int(lengths.sum())
    over = int((lengths > cfg.capacity).sum())
    empty = int((lengths == 0).sum())  # pack skips them: stats counts the others
    if as_json:
        kept = analysis.overflow_kept(rows, tokens)
        best = analysis.least_waste(rows)  # the strategy the text's last line names
        click.echo(json.dumps({"capacity": cfg.capacity, "documents": int(lengths.size),
                               "documents_empty": empty,
                               "tokens": tokens, "overflow": cfg.overflow.value,
                               "min_fill": cfg.min_fill,
                               "segment_multiple": cfg.segment_multiple,
                               "documents_over_capacity": over, "tokens_kept": kept,
                               "lower_bound_rows": -(-kept // cfg.capacity),
                               "strategies": rows,
                               "least_waste": best["strategy"] if best else None,
                               "inputs_not_read": docs.discovery.skipped,
                               "input_notes": docs.discovery.notes,
                               "input_columns_unused": docs.columns.unused,
                               "input_masks": {k: getattr(masked, k) for k in (
                                   "tokens_attention_masked", "tokens_label_masked",
                                   *_BOUNDARY_COUNTS)},
                               "warnings": warnings}, indent=2))
    else:
        click.echo(analysis.format_compare(rows, cfg.capacity, int(lengths.size), tokens,
                                           overflow=cfg.overflow, docs_over_capacity=over,
                                           docs_empty=empty, min_fill=cfg.min_fill,
                                           segment_multiple=cfg.segment_multiple))
        for n in notes:
            click.echo(f"  INPUT: {n}" if not n.startswith("masks:") else f"  {n}")
        if mask:
            click.echo(f"  input: {mask}")
    if plot:
        analysis.plot_compare(lengths, cfg.capacity, plot, overflow=cfg.overflow,
                              targets=docs.targets, window_docs=cfg.window_docs,
                              min_fill=cfg.min_fill, segment_multiple=cfg.segment_multiple)
        if not as_json:
            click.echo(f"wrote {plot}")


def _input_mask_stats(docs):
    """The mask counts of an :class:`~packtool.analysis.InputDocuments` as a PackStats."""
    from packtool.stats import PackStats

    b = docs.boundary
    return PackStats(tokens_attention_masked=docs.masked_tokens,
                     tokens_label_masked=docs.label_masked,
                     docs_bos_added=b.bos_added, docs_bos_present=b.bos_present,
                     docs_eos_added=b.eos_added, docs_eos_present=b.eos_present)


#: the options of the dry run, ``packtool compare``'s own and those of the deprecated
#: ``stats --capacity C --compare`` (hidden there): one list, so the alias takes every one
#: (each a field of :class:`packtool.config.CompareConfig`)
_COMPARE_OPTIONS = [
    _spec("--capacity", "-c", type=int, required=True, metavar="C",
          help="Tokens per row of the dry run."),
    _spec("--column", default=DEFAULT_TOKEN_COLUMN, show_default=True, metavar="NAME",
          help="Token column of the input (list of integer ids)."),
    _spec("--overflow", type=_choice(Overflow), default="split", show_default=True,
          help="Documents longer than C: split into chunks (ordered and obfd; concat's "
               "stream cuts them itself), truncate, drop, or error; what is lost is "
               "counted as waste."),
    *_INPUT_OPTIONS,
    _spec("--window-docs", type=click.IntRange(min=1), default=None, metavar="N",
          help="Also dry-run each strategy in windows of N documents, as pack --strategy S "
               "--window-docs N deals and plans them."),
    _spec("--min-fill", type=click.FloatRange(0, 1), default=0.0, show_default=True,
          metavar="FRACTION",
          help="As pack --min-fill: each plan without its rows under FRACTION x C real "
               "tokens; adds the rows and tokens dropped, counted as waste."),
    _spec("--segment-multiple", type=click.IntRange(min=1), default=1, show_default=True,
          metavar="N",
          help="As pack --segment-multiple: every document piece padded to a multiple of N "
               "tokens inside its row (context parallelism); adds that padding, counted in "
               "the padding. C must be a multiple of N."),
]
#: the names of the dry run's options (their parameters), capacity first
_COMPARE_NAMES = tuple(d[0].lstrip("-").replace("-", "_") for d, _ in _COMPARE_OPTIONS)
#: those of them that are flags (given without a value)
_COMPARE_FLAGS = tuple(n for n, (_, a) in zip(_COMPARE_NAMES, _COMPARE_OPTIONS)
                       if a.get("is_flag"))


@cli.command()
@click.argument("inputs", type=_ExistingPath(), metavar="INPUT...", nargs=-1, required=True)
@_options(_COMPARE_OPTIONS)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_PLOT_OPTION
def compare(inputs, as_json, plot, **options):
    """Dry-run concat, ordered and obfd on raw tokenized INPUT side by side, at capacity C.

    INPUT is read exactly as packtool pack reads it (the same files, mask columns and
    BOS/EOS), so the rows, padding, effective targets, truncated and dropped tokens and
    warnings are those the pack would give, and what pack refuses is refused; the last line
    names the strategy that wastes least. --plot draws the length histogram,
    padding per strategy, documents cut that fit in a row and the fill per row.
    """
    from packtool.config import CompareConfig

    cfg = CompareConfig(inputs=inputs, **options)
    _run_compare(cfg, as_json, plot)


#: the note ``stats --compare`` prints (it stays one release, then goes)
COMPARE_DEPRECATED = ("packtool stats --compare is deprecated and will be removed in the next "
                      "release; run: packtool compare INPUT --capacity C [options]")


@cli.command()
@click.argument("path", type=_ExistingPath(packed_output=True), metavar="OUTPUT", nargs=-1,
                required=True)
@click.option("--per-bin", is_flag=True,
              help="List targets per row and per segment.")
@click.option("--per-bin-limit", type=click.IntRange(min=0), default=None, metavar="N",
              help=f"With --per-bin: list the first N rows (0 = all) [default: "
                   f"{DEFAULT_PER_BIN_LIMIT}]; totals always cover every row.")
@click.option("--per-source-limit", type=click.IntRange(min=0),
              default=DEFAULT_PER_SOURCE_LIMIT, metavar="N", show_default=True,
              help="Outputs packed with --source-column: list the N sources of the most real "
                   "tokens (0 = all; --json lists every one).")
@click.option("--no-hash", is_flag=True,
              help="Packed output: skip the sha256 of every shard against the manifest (it "
                   "reads every byte). Still checked: each shard's size and footer, and the "
                   "page checksums of the columns stats decodes: cu_seqlens, doc_ids, "
                   "num_targets (and cu_seqlens_unpadded, source_ids where stored, with "
                   "source_ids doc_offsets too; labels, input_ids and segment_ids when input "
                   "labels masked targets). A changed page of any other column goes unseen: "
                   "input_ids, segment_ids, position_ids, labels, max_seqlen (and doc_offsets "
                   "without source_ids; the report names this output's; verify --no-hash "
                   "decodes every column).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_PLOT_OPTION
@click.option("--compare", is_flag=True, hidden=True,
              help="Deprecated: use packtool compare INPUT --capacity C.")
# compare's options, hidden: the deprecated stats --capacity C --compare takes every one
@_options(_COMPARE_OPTIONS, hidden=True, required=False)
@click.pass_context
def stats(ctx, path, per_bin, per_bin_limit, per_source_limit, no_hash, as_json, plot, compare,
          **dry):
    """Figures of a packed OUTPUT (a directory or a store URI), recounted from the shards and
    checked against the manifest: rows, padding, effective targets, fill, attention work. Every
    shard's sha256 is checked first (--no-hash skips it, and with it every page stats does not
    decode). Exits 1 when the recount disagrees with the manifest, a shard differs from it,
    or the pieces of one document carry two source ids (--source-column).

    For raw tokenized input, packtool compare INPUT --capacity C dry-runs every strategy
    (stats --capacity C --compare still does, deprecated).
    """
    import json

    from packtool import analysis
    from packtool.errors import ConfigError
    from packtool.startup import release_gc

    release_gc()  # the command's imports are done (packtool/startup.py)

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT

    if per_bin_limit is not None and not per_bin:
        raise ConfigError("--per-bin-limit applies with --per-bin only")
    capacity = dry["capacity"]
    read_opts = _COMPARE_NAMES[1:]  # compare's options but --capacity
    # the read options given, as compare takes them (a suggested compare carries them)
    carried = "".join(
        f" --{n.replace('_', '-')}" + ("" if n in _COMPARE_FLAGS else
                                       f" {shlex.quote(str(ctx.params[n]))}")
        for n in read_opts if given(n))
    if compare:
        from packtool.config import CompareConfig

        raw = " ".join(shlex.quote(str(p)) for p in path)
        click.echo(f"NOTE: {COMPARE_DEPRECATED}"
                   + (f" (here: packtool compare {raw} --capacity {capacity}{carried})"
                      if capacity is not None else ""), err=True)
        if per_bin:
            raise ConfigError("--per-bin lists the rows of a packed output; a dry run writes "
                              "no rows (pack, then run packtool stats OUTPUT --per-bin)")
        if capacity is None:
            raise ConfigError("--compare needs --capacity C (better: packtool compare INPUT "
                              "--capacity C)")
        cfg = CompareConfig(inputs=path, **dry)
        _run_compare(cfg, as_json, plot)
        return
    dry_run = [f"--{n.replace('_', '-')}" for n in ("capacity",) + read_opts if given(n)]
    if dry_run:
        from packtool.formats.manifest import MANIFEST_NAME
        from packtool.location import Location

        raw = " ".join(shlex.quote(str(p)) for p in path)
        note = ""
        if len(path) == 1 and Location.parse(path[0]).join(MANIFEST_NAME).exists():
            raw = "INPUT"  # a packed output: the dry run takes what it was packed from
        elif not given("column"):  # raw input: the --column its compare needs
            carried, note = _dry_run_column(path, carried)
        raise ConfigError(f"{dry_run[0]} is an option of the dry run on raw input, and stats "
                          f"reads a packed OUTPUT, which records its own; for a dry run run: "
                          f"packtool compare {raw} --capacity {capacity or 'C'}{carried}{note}"
                          + (" on the tokenized INPUT it was packed from" if raw == "INPUT"
                             else ""))
    if len(path) != 1:
        raise ConfigError("give one packed OUTPUT directory (for raw input: packtool compare "
                          "INPUT... --capacity C)")
    if plot:
        analysis.require_matplotlib()  # before the work, not after it
    from packtool.location import Location

    out = Location.parse(path[0])
    _refuse_raw_input(out, "stats")
    limit = DEFAULT_PER_BIN_LIMIT if per_bin_limit is None else per_bin_limit
    a = analysis.analyze_packed(out, per_bin=per_bin, per_bin_limit=limit or None,
                                check_hashes=not no_hash)
    warnings = a.warnings  # with 0 rows, why: in the words pack used
    click.echo(json.dumps({**a.to_dict(), "warnings": warnings}, indent=2) if as_json
               else analysis.format_packed(a, per_source_limit=per_source_limit or None))
    for w in warnings:  # on stderr, loud whatever the output format (as pack's)
        click.echo(f"WARNING: {w}", err=True)
    if plot:
        analysis.plot_packed(a, plot)
        if not as_json:
            click.echo(f"wrote {plot}")
    if a.faults:
        raise PacktoolError(f"{display(path[0])}: {a.faults[0]}: rerun the same packtool pack "
                            "with --overwrite")
    if a.mismatches:
        k, (rc, m) = next(iter(a.mismatches.items()))
        where = f" ({a.mismatch_where[k]})" if k in a.mismatch_where else ""
        raise PacktoolError(f"{display(path[0])}: recounted {k} {rc} differs from the "
                            f"manifest's {m}{where}; the shards or the manifest were changed "
                            "after packing: rerun the same packtool pack with --overwrite")


def _dry_run_column(paths, carried: str) -> tuple[str, str]:
    """``carried`` (the options of a suggested compare of raw ``paths``) with the ``--column``
    its first file needs (:func:`_column_option`) put first, and the note to print after it."""
    from packtool.formats.reader import discover

    try:
        files = discover(paths).files
    except PacktoolError:  # compare names the fault itself
        return carried, ""
    column = _column_option(files[0].path if files else None) or ("", "")
    return column[0] + carried, column[1]


def _command_line(command: str, where: str) -> str:
    """The command a message suggests: ``packtool COMMAND WHERE``, or with ``WHERE`` in the
    ``{}`` of a command whose arguments go on after it (``export --to nemo {} DEST``)."""
    return "packtool " + (command if "{}" in command else command + " {}").format(where)


def _then(command: str, where: str) -> str:
    """``, then packtool COMMAND WHERE``: what a message suggests running once the output is
    packed; nothing for ``upgrade`` (a pack of this version writes this version's manifest)."""
    return "" if command == "upgrade" else f", then {_command_line(command, where)}"


def _refuse_raw_input(where, command: str) -> None:
    """One line when the local directory given to ``stats``, ``verify``, ``export`` or
    ``upgrade`` is not a packed output: a pack still writing it, an interrupted pack, empty, packed shards whose manifest
    is gone, or raw tokenized input (each with the command that fits); one data file (a shard
    of an output, or tokenized input) likewise; a store prefix the same way
    (:func:`_refuse_raw_store`).

    Raises:
        ManifestError: ``where`` is a directory without a manifest, or a data file.
    """
    from packtool.errors import ManifestError
    from packtool.formats.manifest import IN_PROGRESS_NAME, MANIFEST_NAME
    from packtool.location import Location

    loc = Location.parse(where)
    if not loc.is_local:
        return _refuse_raw_store(loc, command)
    out = loc.path
    from packtool.formats.reader import _format_of, first_data_file, packed_marker

    if out.is_file():
        _refuse_file(loc, command)
    if not out.is_dir() or (out / MANIFEST_NAME).exists():
        return
    from packtool.formats.manifest import marker_kind, pack_running, running_error

    running = running_error(out, _command_line(command, shlex.quote(str(out))))
    if pack_running(out):
        raise running
    # What the directory holds is looked at first, then the lock and the manifest again: a
    # pack may have taken the lock (and written its marker) or written its manifest (and
    # released the lock) meanwhile, and then what was seen is no answer.
    from packtool.formats.manifest import packed_outputs_below

    for look in range(2):
        try:
            leftovers = (out / IN_PROGRESS_NAME).exists() or any(
                p.name != MANIFEST_NAME for p in out.glob(".packtool-*"))
            empty = not any(out.iterdir())
            nested = [] if leftovers else packed_outputs_below(out)
            # the shards of a packed output below are that output's, not loose data of out
            data = first_data_file(
                rel for rel in (p.relative_to(out).as_posix() for p in out.rglob("*")
                                if p.is_file() and _format_of(p.name))
                if not any(rel.startswith(f"{n}/") for n in nested))
            packed = data is not None and packed_marker(out / data) is not None
            break
        except FileNotFoundError:  # removed while listed: a pack at work, or look again
            if pack_running(out):
                raise running from None
            if look:
                raise ManifestError(f"{out}: its files changed while read; run "
                                    f"{_command_line(command, shlex.quote(str(out)))} again"
                                    ) from None
    if pack_running(out):
        raise running
    if (out / MANIFEST_NAME).exists():
        return  # a pack finished since the first look
    from packtool.formats.manifest import version_1_error

    old = version_1_error(out)
    if old is not None:
        raise old
    _refuse(str(out), command, leftovers=leftovers, empty=empty, packed=packed, data=data,
            data_at=None if data is None else out / data, kind=marker_kind(out),
            nested=nested)


def _refuse_file(loc, command: str) -> None:
    """One line for the data file ``loc`` (a local file or a store object) given to ``stats``,
    ``verify`` or ``export`` where a packed output's directory or prefix is wanted: a shard or
    the manifest of an output (the command on the directory or prefix holding it), or
    tokenized input (the command that fits it). Any other file is left to the reader.

    Raises:
        ManifestError: ``loc`` is a Parquet or Arrow file.
    """
    from packtool.errors import ManifestError
    from packtool.formats.manifest import MANIFEST_NAME
    from packtool.formats.reader import _format_of, packed_marker

    if not _format_of(loc.name):
        return
    data_at = loc.path if loc.is_local else str(loc)
    if loc.name == MANIFEST_NAME or packed_marker(data_at) is not None:
        what = "the manifest" if loc.name == MANIFEST_NAME else "one shard"
        place = "directory" if loc.is_local else "prefix"
        raise ManifestError(f"{loc.display}: is {what} of a packed output; give its {place}: "
                            f"{_command_line(command, shlex.quote(loc.parent.display))}")
    what, hint = _raw_hint(loc.display, command, data_at)
    raise ManifestError(f"{loc.display}: is {what}, not a packed output; for it run: {hint}")


def _refuse_raw_store(loc, command: str) -> None:
    """:func:`_refuse_raw_input` for a store prefix, from one listing of its top level: a run
    writing it now (or, its lock object's holder on another host, writing it or interrupted),
    an interrupted pack, packed shards without a manifest, or tokenized input; one data object
    as :func:`_refuse_file`. A prefix that holds nothing, or a store that cannot be listed, is
    left to the reader (its line names the bucket or the store's fault)."""
    from packtool.formats.manifest import MANIFEST_NAME, writing_error
    from packtool.formats.reader import _format_of, first_data_file, packed_marker

    try:
        if loc.join(MANIFEST_NAME).exists():
            return
        one = loc.is_file()
        entries = {} if one else loc.listdir()
    except OSError:
        return
    if one:
        return _refuse_file(loc, command)
    if not entries:
        return
    # a run holding the lock is said first; one that finished since wrote its manifest before
    # it released the lock, so the manifest is looked for again before "interrupted"
    running = writing_error(loc, _command_line(command, shlex.quote(loc.display)))
    if running is not None:
        raise running
    try:
        if loc.join(MANIFEST_NAME).exists():
            return
    except OSError:
        return
    data = first_data_file(n for n, e in entries.items() if not e.is_dir and _format_of(n))
    from packtool.formats.manifest import version_1_error

    old = version_1_error(loc)
    if old is not None:
        raise old
    from packtool.formats.manifest import IN_PROGRESS_NAME, marker_kind, packed_outputs_below

    leftovers = any(n.startswith(".packtool-") for n in entries)
    _refuse(loc.display, command, leftovers=leftovers,
            empty=False, packed=data is not None and packed_marker(str(loc.join(data)))
            is not None, data=data, data_at=None if data is None else str(loc.join(data)),
            kind=marker_kind(loc) if IN_PROGRESS_NAME in entries else None,
            nested=[] if leftovers else packed_outputs_below(loc))




def _column_option(data_at) -> tuple[str, str] | None:
    """The ``--column`` a suggested ``pack`` or ``compare`` of raw input needs, as read from
    ``data_at`` (a data file of it, path or URI), and a note to print after the command:
    ``("", "")`` when the file has :data:`DEFAULT_TOKEN_COLUMN` (or cannot be read: the
    reader names its fault then); `` --column NAME`` of its one obvious token column
    (:func:`packtool.formats.schema.token_column_candidates`); `` --column NAME`` literally,
    with a note naming the candidates, when there are several; None when it holds no list of
    integers at all (text, to be tokenized first)."""
    from packtool.formats.reader import input_schema
    from packtool.formats.schema import token_column_candidates

    try:
        schema = input_schema(data_at)[0] if data_at is not None else None
    except PacktoolError:
        schema = None
    if schema is None or DEFAULT_TOKEN_COLUMN in schema.names:
        return "", ""
    found = token_column_candidates(schema)
    if not found:
        return None
    if len(found) == 1:
        return f" --column {shlex.quote(found[0])}", ""
    name = str(data_at).rstrip("/").rsplit("/", 1)[-1]
    return " --column NAME", (f" (NAME: its column of token ids, one of {', '.join(found)}, as "
                              f"{name} holds no {DEFAULT_TOKEN_COLUMN})")


def _raw_hint(out: str, command: str, data_at) -> tuple[str, str]:
    """What raw input ``out`` (a folder, prefix or file) holds, in words, and the command that
    fits it, to be run as printed: ``compare`` for ``stats``, else ``pack`` then ``command``,
    with the ``--column`` that ``data_at`` (its first data file, :func:`~packtool.formats.reader.first_data_file`)
    needs (:func:`_column_option`); ``packtool tokenize`` first when it holds no token ids."""
    q = shlex.quote(out)
    column = _column_option(data_at)
    if column is None:  # no token ids at all: text, to be tokenized first
        then = ("packtool compare TOKENIZED --capacity C" if command == "stats" else
                f"packtool pack --capacity C TOKENIZED OUTPUT{_then(command, 'OUTPUT')}")
        return ("data with no column of token ids (no list of integers)",
                f"packtool tokenize --tokenizer FILE {q}{_skip_option(out, text=True)} "
                f"TOKENIZED (--text-column NAME if its text is not in 'text'), then {then}")
    option, note = column
    option += _skip_option(out)
    hint = (f"packtool compare {q} --capacity C{option}" if command == "stats" else
            f"packtool pack --capacity C{option} {q} OUTPUT{_then(command, 'OUTPUT')}")
    return "tokenized input", hint + note


def _skip_option(out: str, text: bool = False) -> str:
    """`` --skip-unsupported`` when the input ``out`` is refused for files of another format
    (``data.csv`` beside the shards) and read without them, so that a command suggested for it
    runs as printed; else empty (also when ``out`` cannot be listed: the command will say why).
    """
    from packtool.formats.reader import discover

    try:
        discover([out], text=text)
        return ""
    except Exception:
        pass
    try:
        discover([out], text=text, skip_unsupported=True)
    except Exception:
        return ""
    return " --skip-unsupported"


def _refuse(out: str, command: str, *, leftovers: bool, empty: bool, packed: bool,
            data: str | None, data_at=None, kind: str | None = None, nested=()) -> None:
    """The one line for a directory or prefix ``out`` that is not a packed output (``data``:
    its first data file outside ``nested``, relative to it,
    :func:`~packtool.formats.reader.first_data_file`; ``data_at``: that file's path or URI;
    ``kind``: what its in-progress marker says was being written,
    :func:`packtool.formats.manifest.marker_kind`; ``nested``: the packed outputs below it,
    :func:`packtool.formats.manifest.packed_outputs_below`, named unless ``out`` holds
    packed shards of its own; ``data`` is then said to be beside them)."""
    from packtool.errors import ManifestError
    from packtool.formats.manifest import MANIFEST_NAME, TOKENIZED_KIND, nested_outputs_error

    if leftovers and kind == TOKENIZED_KIND:  # documents: packed once the tokenize is finished
        hint = _raw_hint(out, command, data_at)[1]
        raise ManifestError(f"{out}: an interrupted packtool tokenize run (no {MANIFEST_NAME} "
                            "yet): tokenized documents, not a packed output; rerun the same "
                            f"packtool tokenize command to finish it, then run: {hint}")
    if leftovers:
        raise ManifestError(f"{out}: an interrupted pack (no {MANIFEST_NAME} yet); rerun the same "
                            "packtool pack command to finish it"
                            f"{_then(command, shlex.quote(out))}")
    if empty:
        raise ManifestError(f"{out}: is an empty directory, not a packed output; pack into it "
                            f"first: packtool pack --capacity C INPUT {shlex.quote(out)}")
    if nested and not packed:  # the outputs below are complete: give one of them
        raise nested_outputs_error(out, nested, lambda shown: "run " + _command_line(
            command, shlex.quote(shown)), other=data)
    if packed:
        raise ManifestError(f"{out}: holds packed shards ({data}) but no "
                            f"{MANIFEST_NAME}, which was removed or never written, so the shards "
                            "cannot be checked; pack again: the same packtool pack command with "
                            "--overwrite")
    if data is not None:
        what, hint = _raw_hint(out, command, data_at)
        raise ManifestError(f"{out}: holds {what} ({data}), not a packed output (no "
                            f"{MANIFEST_NAME}); for it run: {hint}")
    raise ManifestError(f"{out}: no {MANIFEST_NAME}, so not a packed output; give the OUTPUT "
                        "directory of packtool pack")


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(readable=False),
              metavar="INPUT... OUTPUT")
@click.option("--tokenizer", required=True, metavar="FILE",
              help="Local tokenizer file: a Hugging Face tokenizer.json, a Tekken JSON "
                   "(mistral-common) or a tiktoken BPE file (never downloaded); or a folder "
                   "holding one tokenizer.json or tekken.json.")
@click.option("--text-column", default="text", show_default=True, metavar="NAME",
              help="Column (JSON Lines: key) holding the text.")
@click.option("--keep-column", "keep_columns", multiple=True, metavar="NAME",
              help="Carry this column (JSON Lines: key, as text) into the tokenized shards "
                   "beside input_ids, e.g. for pack --source-column (repeatable) [default: "
                   "input_ids alone].")
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
              help="Encoding threads, for every tokenizer kind (a tokenizer.json too) "
                   "[default: all cores].")
@click.option("--skip-unsupported", is_flag=True,
              help="Read the supported files of an INPUT directory and list the others in the "
                   "summary [default: refuse a directory holding files of another format].")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUTPUT.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def tokenize(paths, tokenizer, text_column, keep_columns, append_eos, prepend_bos, add_special_tokens,
             tokenizer_pattern, batch_docs, rows_per_shard, workers, skip_unsupported, overwrite,
             quiet, as_json):
    """Tokenize text INPUT files or directories (Parquet, Arrow, JSON Lines; paths or URIs)
    into the tokenized Parquet OUTPUT that packtool pack reads.

    One document per row or line (blank JSON Lines lines hold none and are skipped), tokens in
    input_ids (list<int32>), in input order, with the --keep-column columns beside them. Rerunning
    an interrupted tokenize finishes it; rerunning a finished one does nothing.
    """
    import json

    from packtool.config import TokenizeConfig
    from packtool.startup import release_gc
    from packtool.text.run import run_tokenize

    release_gc()  # the command's imports are done (packtool/startup.py)

    if len(paths) < 2:
        raise click.UsageError("give at least one INPUT and an OUTPUT directory")
    _new_folder(paths[-1], "OUTPUT")
    cfg = TokenizeConfig(inputs=tuple(paths[:-1]), output=paths[-1], tokenizer=tokenizer,
                         text_column=text_column, keep_columns=keep_columns,
                         append_eos=append_eos,
                         prepend_bos=prepend_bos, add_special_tokens=add_special_tokens,
                         tokenizer_pattern=tokenizer_pattern, batch_docs=batch_docs,
                         rows_per_shard=rows_per_shard,
                         workers=(os.cpu_count() or 1) if workers is None else workers,
                         overwrite=overwrite, skip_unsupported=skip_unsupported)
    _early_stop_words(((cfg.output, "OUTPUT"),))
    try:
        res = run_tokenize(cfg, progress=not quiet)
    except KeyboardInterrupt as exc:
        from packtool.signals import exit_status, stop_word

        kept = str(exc)  # what OUTPUT holds, from run_tokenize
        # the advice where the same command would not resume what is kept
        # (Output.replaced_untouched)
        rerun = getattr(exc, "rerun", None) or "rerun the same command to resume and finish it"
        raise Interrupted(f"{stop_word()}: " + (
            f"{kept}; {rerun}" if kept else
            f"nothing was written ({display(cfg.output)} is as it was before the run); rerun the "
            "same "
            "command to tokenize"), exit_status()) from None
    for w in res.warnings:  # on stderr, loud whatever the output format (as pack's)
        if w not in res.said:
            click.echo(f"WARNING: {w}", err=True)
    if as_json:
        t = res.manifest.totals
        click.echo(json.dumps({"documents": res.documents, "tokens": res.tokens,
                               "shards": res.shards, "shards_reused": res.shards_reused,
                               "seconds": res.seconds, "inputs_not_read": res.skipped,
                               "already_complete": res.already_complete,
                               "warnings": res.warnings,
                               **{k: getattr(t, k) for k in _BOUNDARY_COUNTS}}, indent=2))
    elif res.already_complete and not quiet:  # -q: nothing on success
        from packtool.formats.manifest import older_version_note

        click.echo(f"{display(cfg.output)}: already holds this tokenization"
                   f"{older_version_note(res.manifest, display(cfg.output))}; nothing to do")
    elif not quiet:
        from packtool.stats import plural

        rate = res.tokens / res.seconds if res.seconds else 0.0
        t = res.manifest.totals
        click.echo(f"tokenized {plural(res.documents, 'document')} into "
                   f"{plural(res.tokens, 'token')} in {plural(res.shards, 'shard')} -> "
                   f"{display(cfg.output)}\n"
                   f"  {res.seconds:.2f} s, {rate / 1e6:.2f} M tokens/s"
                   + (f", {plural(res.shards_reused, 'shard')} reused" if res.shards_reused
                      else "")
                   + (f"\n  input: {t.input_note()}" if t.input_note() else "")
                   + (f"\n  INPUT: {res.skipped_note}" if res.skipped_note else ""))


@cli.command()
@click.argument("output", type=_ExistingPath(packed_output=True), metavar="OUTPUT")
@click.argument("dest", type=click.Path(), metavar="DEST")
@click.option("--to", "target", type=click.Choice(["nemo"]), required=True,
              help="nemo: the packed Parquet of NeMo / Megatron-Bridge "
                   "(GPTSFTPackedParquetDataset: input_ids, loss_mask, seq_start_id).")
@click.option("--split", type=click.Choice(["training", "validation"]), default=None,
              help="Names the file DEST/SPLIT_C.idx.parquet [default: validation for the "
                   "held-out output of pack --holdout, else training].")
@click.option("--overwrite", is_flag=True, help="Replace the file if it exists.")
@click.option("--eos-id", type=click.IntRange(min=0), default=None, metavar="ID",
              help="The EOS id of the trainer's tokenizer: documents holding it before their "
                   "last token are counted, and a warning says when Megatron-Bridge's packed "
                   "collate would train them otherwise (it treats a fed EOS as padding) "
                   "[default: pack's --append-eos, else the --append-eos of the packtool "
                   "tokenize it was packed from; none: not looked for; a note names another "
                   "EOS id the manifest records].")
@click.option("--no-hash", is_flag=True,
              help="Skip the sha256 of every shard against the manifest (it reads every "
                   "byte; stats and verify check it too). Still checked: each shard's size and "
                   "footer, and the page checksums of the columns the export decodes: "
                   "input_ids, segment_ids, cu_seqlens, doc_ids, doc_offsets (and labels where "
                   "stored). A changed page of any other column goes unseen: position_ids, "
                   "max_seqlen, num_targets (and cu_seqlens_unpadded, source_ids where "
                   "stored).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def export(output, dest, target, split, overwrite, eos_id, no_hash, as_json):
    """Write the packed rows of OUTPUT (a directory or a store URI) in another trainer's packed
    format, into the local directory DEST.

    With --to nemo: DEST/SPLIT_C.idx.parquet (the packtool rows, padding dropped, one sequence
    per segment, loss_mask carrying the labels; 500 rows per row group) and its entry in
    DEST/C_metadata.jsonl, the layout NeMo and Megatron-Bridge train from. The padding inside
    the spans of a --segment-multiple output is dropped too (a note says so). Every shard's
    sha256 is checked first, as stats and verify check it (--no-hash skips it), and a manifest
    whose shards' rows do not add up to its totals is refused: nothing is written then.
    """
    import dataclasses
    import json

    from packtool.formats.nemo import export_nemo
    from packtool.startup import release_gc

    release_gc()  # the command's imports are done (packtool/startup.py)

    _new_folder(dest, "DEST")
    _refuse_raw_input(output, "export --to nemo {} DEST")
    try:
        res = export_nemo(output, dest, split=split, overwrite=overwrite, eos_id=eos_id,
                          check_hashes=not no_hash)
    except KeyboardInterrupt as exc:
        from packtool.signals import exit_status, stop_word

        said = str(exc) or f"nothing was written into {dest}"
        raise Interrupted(f"{stop_word()}: {said}; rerun the same command to export",
                          exit_status()) from None
    from packtool.stats import plural

    if as_json:
        click.echo(json.dumps(dataclasses.asdict(res), indent=2))
    elif res.already_complete:
        click.echo(f"{res.path}: already holds this export ({plural(res.rows, 'row')}); "
                   "nothing to do")
    elif res.completed_entry:
        click.echo(f"{res.path}: already exported (by a run stopped before its metadata "
                   f"entry); entry written to {res.metadata}")
    else:
        left = ""
        if res.one_token_sequences_left_out:
            left = (f"; {plural(res.one_token_sequences_left_out, 'one-token sequence')} left "
                    "out (no input, no target; a zero-length sequence to their collate)")
            if res.rows_left_out:  # whole rows, of those sequences only
                left += (f", with the {plural(res.rows_left_out, 'row')} that held nothing "
                         "else")
        click.echo(f"exported {plural(res.rows, 'row')} ({plural(res.sequences, 'sequence')}, "
                   f"{plural(res.tokens, 'token')}, {plural(res.targets, 'loss-mask target')})"
                   f"{left} -> {res.path}")
    if not as_json:
        if res.shards_hashed:
            click.echo(f"  integrity: sha256 of {plural(res.shards_hashed, 'shard')} matches "
                       "the manifest (--no-hash skips it)")
        for note in res.notes:
            click.echo(f"  note: {note}")
    for w in res.warnings:  # on stderr, loud whatever the output format (as stats prints them)
        click.echo(f"WARNING: {w}", err=True)


_BACKENDS = ("sdpa", "flex", "varlen", "flash", "hf", "hybrid", "mamba")


@cli.command()
@click.argument("output", type=_ExistingPath(packed_output=True), metavar="OUTPUT")
@click.option("--rows", type=click.IntRange(min=0), default=None, metavar="N",
              help="Rows run through the models, spread over all shards, drawn from rows that "
                   "hold two documents or more and a target (with --no-scan: drawn from all "
                   "rows); a row of two documents, one holding a target and one holding "
                   "padding added where none of them does [default: 8; 0 = all].")
@click.option("--scan/--no-scan", "scan_all", default=True, show_default=True,
              help="Check the columns of every row (NumPy only); --no-scan checks only the "
                   "sampled rows (and looks for the rows the sample lacks, as --rows says).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the row sample and the test models.")
@click.option("--backend", "backends", multiple=True, type=click.Choice(_BACKENDS),
              help="Backend to check (repeatable); each one named must run and pass; hybrid and "
                   "mamba add convolution and recurrence layers reset by seq_idx (mamba: the "
                   "CUDA kernels) [default: every backend that can run here; the others are "
                   "listed as skipped].")
@click.option("--hf-config", "hf_config", default=None, metavar="PATH",
              help="Your model: a Hugging Face config.json (or its directory, or a model name "
                   "already in the transformers cache; never downloaded). The hf backend builds "
                   "that architecture shrunk to a test size with random weights, feeds it the "
                   "packed rows as HFCollator does and says which layer leaks and what it "
                   "needs [default backends then: hf].")
@click.option("--check", "checks", multiple=True, metavar="NAME",
              help="Report only these checks (repeatable): logits_match, isolation, "
                   "loss_denominator, grad_zero_ignored, grad_zero_padding, finite, or a column "
                   "check (schema, input_ids, cu_seqlens, cu_seqlens_unpadded, segment_ids, "
                   "position_ids, max_seqlen, doc_ids, labels, num_targets, padding, "
                   "doc_offsets, totals) [default: all].")
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
@click.option("--row-window", type=int, default=None, metavar="TOKENS", callback=_row_window,
              help="Run the model checks on windows of this many tokens of each sampled row, "
                   "each holding a document boundary (and one into the padding when the row "
                   "has some): 2 or more, or 0 for whole rows; the column scan still covers "
                   "every token [default: 1024].")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="Run FlexAttention through torch.compile [default: on CUDA, and on CPU from "
                   "2,048 tokens per row window up].")
@click.option("--progress/--no-progress", default=None,
              help="A progress line per backend and batch on stderr [default: on, off with "
                   "--json].")
@click.option("--no-hash", is_flag=True,
              help="Skip the sha256 of every shard against the manifest (it reads every "
                   "byte). Still checked: each shard's size and footer, and the checksum of "
                   "every page verify decodes: with the default --scan every page of every "
                   "column, so a changed page is still refused; with --no-scan only the row "
                   "groups of the sampled rows are decoded whole, so a changed page elsewhere "
                   "can go unseen.")
@click.option("--negative-control", is_flag=True,
              help="Also run the sdpa checks on exactly the rows (and row windows) the model "
                   "checks ran on, with a plain causal mask (no "
                   "document blocks), which must fail: shows that verify catches a leak on "
                   "this output; exit 1 when it does not.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(output, rows, seed, backends, hf_config, checks, data_only, device, max_memory,
           batch_size, row_window, compile_, progress, no_hash, as_json, scan_all,
           negative_control):
    """Prove that packed rows of OUTPUT compute what separate documents compute.

    Checks the column contract of every row, then runs a small seeded decoder (with attention,
    and with convolution and recurrence layers reset by seq_idx) and a tiny random Hugging Face
    model (a Llama, or your architecture with --hf-config) on sampled rows with each backend and
    compares with per-document forwards: logits, isolation, the loss denominator, gradients at ignored
    positions and padding, finiteness. Exit 0 only when every requested check ran and passed
    and an attention check ran on a row holding two or more documents (or --data-only; an
    output of one document per row has no such row: isolation is skipped there, not
    required); a 0-row output, a skipped requested backend, or a failed check exit 1 saying
    why.
    """
    import json

    from packtool.errors import ConfigError
    from packtool.startup import release_gc
    from packtool.verify.checks import run_verify

    release_gc()  # the command's imports are done (packtool/startup.py)

    budget = None
    if max_memory is not None:
        from packtool.verify.runners import memory_budget, parse_size

        try:
            budget = parse_size(max_memory)
            memory_budget(budget)  # a budget too small is refused before any work
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--max-memory") from None
    if data_only and (backends or hf_config or negative_control):
        raise click.UsageError("--data-only runs no backend; drop --backend, --hf-config and "
                               "--negative-control")
    if hf_config is not None and backends and "hf" not in backends:
        raise click.UsageError("--hf-config is the model of the hf backend; add --backend hf")
    _refuse_raw_input(output, "verify")
    show = (not as_json) if progress is None else progress
    try:
        report = run_verify(output, rows=rows, seed=seed, backends=backends or None,
                            checks=checks or None, batch_size=batch_size, compile=compile_,
                            scan_all=scan_all, data_only=data_only, device=device,
                            max_memory=budget, hf_config=hf_config, check_hashes=not no_hash,
                            row_window=row_window,
                            progress=(lambda m: click.echo(m, err=True)) if show else None)
        control = None
        if negative_control:
            from packtool.verify.checks import negative_control as run_control

            if show:
                click.echo("verify: negative control: sdpa with a plain causal mask on the same "
                           "rows (must fail)", err=True)
            # exactly the rows (and windows) the model checks above ran on
            control = run_control(output, indices=report.indices, seed=seed,
                                  batch_size=batch_size, device=device, max_memory=budget,
                                  row_window=row_window)
            # an output of one document per row has no boundary a mask could leak across
            control["applicable"] = report.multi_doc_rows is not False
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({**report.to_dict(), **({"negative_control": control}
                                                      if control is not None else {})},
                              indent=2))
    else:
        click.echo(report.format_text())
        if control is not None:
            click.echo(_control_line(control))
    if not report.ok:
        raise PacktoolError(report.first_failure_message())
    if control is not None and not control["caught"] and control["applicable"]:
        if report.windows and report.multi_doc_rows:
            fix = ("no row window run holds two documents?): pass a larger --row-window (0: "
                   "whole rows)")
        elif rows is not None and rows <= 0:
            fix = ("though every row ran, rows of two documents among them): the checks "
                   "cannot tell a leaking mask from a good one on this machine")
        else:
            fix = "no sampled row holds two documents?): verify more rows (--rows 0)"
        raise PacktoolError("negative control: a plain causal mask passed the sdpa checks on "
                            "these rows, so this verify could not have caught a leak here ("
                            + fix)


def _control_line(control: dict) -> str:
    """The report's line for ``verify --negative-control``."""
    head = "CONTROL sdpa         plain causal mask   "
    if not control["caught"] and not control.get("applicable", True):
        return head + ("not applicable: no row of the output holds two documents, so no mask "
                       "can let one read another here")
    if not control["caught"]:
        return head + "NOT caught: the checks passed with a leaking mask"
    where = " ".join(f"{k}={v}" for k, v in (control["where"] or {}).items())
    figs = "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in control["figures"].items())
    return (head + f"caught as it must be: {control['check']} fails" + (f" at {where}" if where
                                                                          else "")
            + (f"  ({figs})" if figs else ""))


@cli.command()
@click.argument("output", type=_ExistingPath(packed_output=True), metavar="OUTPUT")
def upgrade(output):
    """Rewrite the manifest of an OUTPUT written by an older packtool (pack, or tokenize) in
    this version's format, without rewriting its shards (every shard's sha256 is checked first).
    """
    from packtool.formats.manifest import FORMAT_VERSION
    from packtool.formats.upgrade import upgrade_manifest
    from packtool.startup import release_gc

    from packtool.signals import exit_status, stop_word

    release_gc()  # the command's imports are done (packtool/startup.py)
    _refuse_raw_input(output, "upgrade")  # the exact case, in the words of stats and export
    try:
        rewritten = upgrade_manifest(output)  # interruptible inside
    except KeyboardInterrupt:
        raise Interrupted(f"{stop_word()}: {display(output)} is unchanged (its manifest was not "
                          "rewritten); rerun the same command to upgrade it",
                          exit_status()) from None
    if rewritten:
        click.echo(f"{display(output)}: manifest rewritten as format version {FORMAT_VERSION}; "
                   "shards "
                   "unchanged")
    else:
        click.echo(f"{display(output)}: already format version {FORMAT_VERSION}; nothing to do")


def main() -> None:
    """Console entry point (see :func:`packtool.__main__.main`, which also handles an early
    Ctrl-C)."""
    from packtool.formats.memory import prepare
    from packtool.startup import numba_without_cffi, numpy_with_one_blas_thread

    prepare()  # Arrow's jemalloc options, before pyarrow is imported (formats/memory.py)
    numba_without_cffi()
    numpy_with_one_blas_thread()
    cli(prog_name="packtool")
