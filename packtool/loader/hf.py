"""Hugging Face ``transformers.Trainer`` glue: a data collator that keeps documents isolated.

Hugging Face causal LMs find document boundaries in a packed row from ``position_ids`` restarting
at 0 (those whose attention mask reads them: OPT, BLOOM, MPT, GPT-OSS and a few more never do,
``docs/architectures.md``), but only when no key/value cache is built and no ``attention_mask``
is given; with the default ``use_cache=True`` (train mode included) they fall back to one causal
mask over the row and documents attend to each other (B02, B29). Their ``flash_attention_2`` path reads the
boundaries from ``position_ids`` only for a batch of one row ([1, N]); for [B, C] with B > 1 it
runs plain causal attention over each row unless it is given ``cu_seq_lens_q``/``cu_seq_lens_k``
and ``max_length_q``/``max_length_k`` (then it flattens the batch and runs varlen attention).
:class:`HFCollator` therefore puts those four (over the batch's B * C tokens, padding tail
included) and ``use_cache=False`` in every batch, next to ``input_ids``, ``position_ids`` and
**unshifted**
``labels`` (the model shifts them, so shifted ones would be scored against the token two
places on, B05). ``Trainer``'s default ``remove_unused_columns=True`` filters the items
before the collator runs, never the batch it returns: every key of the batch reaches the
model's ``forward`` (the ``cu_seq_lens`` / ``max_length`` keywords through its
``**kwargs``; sdpa, eager and flex attention ignore them). That default drops every item key
the model's ``forward`` does not name (``segment_ids``, ``cu_seqlens``, ``labels_mode``, ...), so the
collator needs only those three: segments are recovered from ``position_ids`` restarting at 0.
The items' ``labels_convention`` key goes too, so the collator cannot read the convention from
the items: it takes them to be ``unshifted`` (the dataset default) and checks the values, so
shifted labels are refused, never shifted a second time. ``Trainer`` counts labels != -100 over
a step's batches (``num_items_in_batch``) and divides the summed loss by it once, which is the
effective-target denominator (B20).

Hybrid and linear-attention models (Mamba-2 / SSD, short convolutions: Bamba, Falcon-H1, Zamba2,
Nemotron-H, Qwen3-Next, ...) need more than positions: their convolution and recurrent state
carry one document into the next unless they get ``seq_idx`` (int32, each token's document
index), which :class:`HFCollator` adds to every batch; Hugging Face passes it to the mamba-ssm /
causal-conv1d kernels. Which models honour it where: ``docs/architectures.md``.
"""

from __future__ import annotations

from packtool.loader.collate import (_cu, _deliver, _labels, _needs, _positions, _seq_idx,
                                     _structure, _tensor, require_torch, rows_of)
from packtool.loader.wrappers import refuse_accelerate_wrapper

__all__ = ["HFCollator"]

class HFCollator:
    """``data_collator`` for ``transformers.Trainer`` over packtool loader items.

    Args:
        flatten: False: [B, C] tensors; True: the flattened [1, B * C] form, the form
            ``DataCollatorWithFlattening`` gives (which has no padding; here each row's padding
            tail stays as a segment of its own, labels -100).
        flash_attn_kwargs: also return ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32 [D + 1]:
            the boundaries of the batch's D segments over its B * C tokens, the padding tail a
            segment of its own) and ``max_length_q``/``max_length_k`` (int, tokens), which
            Hugging Face's ``flash_attention_2`` path needs to keep documents apart in a [B, C]
            batch with B > 1 (from ``position_ids`` alone it does so for one row only); sdpa,
            eager and flex attention ignore them. ``Trainer`` passes them to the model's
            ``forward`` (its ``**kwargs``). False only for a model whose ``forward`` takes no
            such keywords; with ``flash_attention_2`` then use ``flatten=True``. Under
            ``torch.compile`` the int ``max_length`` recompiles per distinct value. Gated
            DeltaNet layers (Qwen3-Next, OLMo hybrid) hand ``cu_seq_lens_q`` to
            flash-linear-attention, which takes it for a batch of one row only: train those
            with ``flatten=True``.
        labels_mode: convention of the items' labels when they do not say (``Trainer``'s default
            ``remove_unused_columns`` drops every item key but ``input_ids``, ``position_ids``
            and ``labels`` before the collator runs); checked against the values. Build the
            dataset with ``labels="unshifted"`` (the default) and keep this default.
        seq_idx: add ``seq_idx`` (int32, [B, C] per row, or [1, B * C] over the batch with
            ``flatten``), the keyword Hugging Face hybrid models pass to their mamba-ssm and
            causal-conv1d kernels. Without those kernels (the CPU path) transformers refuses it
            with a ValueError rather than mixing documents, or a model ignores it: ``packtool
            verify --hf-config`` says which. False leaves it out.

    Call: ``collator(items)`` (or a :class:`~packtool.formats.packed.Rows`) -> dict with
    ``input_ids`` torch.int32, ``position_ids`` and ``labels`` torch.int64 [B, C] (or
    [1, B * C]), ``use_cache=False``, ``seq_idx`` torch.int32 of the same shape,
    ``cu_seq_lens_q``/``cu_seq_lens_k`` torch.int32 [D + 1] and ``max_length_q``/
    ``max_length_k`` int; labels in
    :attr:`labels_convention`, ``unshifted`` (converted from items that say they are shifted).
    No other key: ``Trainer`` hands every key to the model's ``forward``, so per-token
    ``token_source_ids`` come from :func:`~packtool.loader.collate.collate` /
    :func:`~packtool.loader.collate.collate_flat` in a loop of one's own.

    Raises:
        ValueError: empty batch or rows of different capacity; items without ``input_ids``
            and ``segment_ids`` or ``position_ids`` with ``labels`` (the padding tail could not
            be told from a document); items that do not say their convention and whose labels
            contradict ``labels_mode`` (when called).
        OverflowError: B * C does not fit int32 boundaries (when called).
    """

    #: the convention of the labels every batch holds (the model shifts them)
    labels_convention = "unshifted"

    def __init__(self, *, flatten: bool = False, flash_attn_kwargs: bool = True,
                 labels_mode: str = "unshifted", seq_idx: bool = True) -> None:
        if labels_mode not in ("unshifted", "shifted"):
            raise ValueError(f"labels_mode must be 'unshifted' or 'shifted', got {labels_mode!r}")
        self.labels_mode = labels_mode
        self.flatten = bool(flatten)
        self.flash_attn_kwargs = bool(flash_attn_kwargs)
        self.seq_idx = bool(seq_idx)

    def needs_columns(self, columns) -> None:
        """Refuse item columns this collator cannot make a correct batch of.

        Raises:
            ValueError: ``input_ids`` missing, or both ``segment_ids`` and ``position_ids`` with
                ``labels`` (:func:`~packtool.loader.collate.check_item_columns`).
        """
        _needs(columns)

    def __call__(self, batch) -> dict:
        torch = require_torch()
        if self.flash_attn_kwargs:  # boundaries that accelerate's dispatching would cut
            refuse_accelerate_wrapper(depth=64)
        rows = rows_of(batch)
        _needs(set(rows.tokens) | set(rows.ragged))
        _structure(rows)
        cu_seqlens, max_seqlen = _cu(rows)  # checks the int32 range
        ids = rows.tokens["input_ids"]
        shape = (1, ids.size) if self.flatten else ids.shape
        labels = _labels(rows, want="unshifted", default_mode=self.labels_mode,
                         cu=cu_seqlens)[0]
        out = {"input_ids": _tensor(torch, ids, torch.int32, shape),
               "position_ids": _tensor(torch, _positions(rows), torch.int64, shape),
               "labels": _tensor(torch, labels, torch.int64, shape),
               "use_cache": False}
        if self.seq_idx:
            out["seq_idx"] = torch.from_numpy(_seq_idx(cu_seqlens, ids.shape, self.flatten))
        if self.flash_attn_kwargs:
            cu = torch.from_numpy(cu_seqlens)
            out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max_seqlen,
                       max_length_k=max_seqlen)
        return _deliver(out)
