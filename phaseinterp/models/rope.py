"""Rotate-half RoPE on the first ``rotary_dims`` dims of each head."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from phaseinterp.config import CompressedConfig


def rotary_tables(cfg: CompressedConfig, device=None) -> tuple[Tensor, Tensor]:
    """cos/sin ``[n_ctx, rotary_dims / 2]`` for rotate-half RoPE on the first ``rotary_dims`` dims."""
    r = max(cfg.rotary_dims, 2)
    inv_freq = cfg.rope_base ** (-torch.arange(0, r, 2, dtype=torch.float64, device=device) / r)
    angles = torch.arange(cfg.n_ctx, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(
    x: Float[Tensor, "batch pos head d_head"],
    cos: Float[Tensor, "pos *head half"],
    sin: Float[Tensor, "pos *head half"],
    dims: int,
) -> Float[Tensor, "batch pos head d_head"]:
    """Rotate-half RoPE; ``cos``/``sin`` per position, or per (position, head) for per-head grids. The
    tables (fp32) are cast to ``x``'s dtype, so bf16 queries and keys stay bf16 like the values they meet
    (FSDP2's bf16 parameters outside autocast); an fp32 ``x`` is unchanged."""
    if dims == 0:
        return x
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = dims // 2
    x1, x2, rest = x[..., :half], x[..., half:dims], x[..., dims:]
    c, s = (cos[None], sin[None]) if cos.ndim == 3 else (cos[None, :, None, :], sin[None, :, None, :])
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)
