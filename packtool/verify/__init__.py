"""Torch side of packtool: the data path users train with, and ``packtool verify``.

This is the only package that imports torch, and it does so lazily: importing
``packtool.verify`` works without torch; calling into it raises
:class:`~packtool.errors.MissingDependencyError` naming what to install
(:func:`packtool.errors.install_hint`).

Modules: :mod:`~packtool.verify.contract` (the NumPy output contract),
:mod:`~packtool.verify.masks` (SDPA block-diagonal mask, FlexAttention document mask),
:mod:`~packtool.verify.model` (the small seeded decoder and its attention backends),
:mod:`~packtool.verify.hybrid` (its convolution and recurrence layers, reset by ``seq_idx``),
:mod:`~packtool.verify.hf_model` (``--hf-config``: the user's architecture, shrunk),
:mod:`~packtool.verify.checks` (``run_verify`` and the report).
"""

from __future__ import annotations

import importlib.util

from packtool.loader.collate import require_torch

__all__ = ["require_torch", "has_torch", "has_cuda", "has_flash_attn", "has_flex_attention",
           "has_transformers"]


def has_torch() -> bool:
    """True when torch can be imported."""
    return importlib.util.find_spec("torch") is not None




def has_cuda() -> bool:
    """True when torch is installed and sees a CUDA device."""
    if not has_torch():
        return False
    import torch

    return bool(torch.cuda.is_available())


def has_flash_attn() -> bool:
    """True when the ``flash_attn`` package (the ``gpu`` extra) can be imported."""
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception:  # a broken build (ABI mismatch) counts as missing
        return False
    return True


def has_flex_attention() -> bool:
    """True when this torch has ``torch.nn.attention.flex_attention``."""
    return has_torch() and importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def has_transformers() -> bool:
    """True when Hugging Face transformers can be imported."""
    return importlib.util.find_spec("transformers") is not None
