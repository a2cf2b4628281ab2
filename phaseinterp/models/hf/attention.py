"""Attention and decoder block of `HookedDeepseekV4`: HF's DeepSeek-V4 layer forward, hooked.

Line-by-line re-implementations of HF's ``DeepseekV4Attention`` (eager) and
``DeepseekV4DecoderLayer`` over the HF modules' own parameters, with the ``blocks.{l}.*``
HookPoints (every hook, its shape and the key layout: docs/hooks.md).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from phaseinterp.models.hf.compressor import CompressorHooks, _hf, _NoCompressor
from phaseinterp.models.hf.config import SLIDING


class NormHooks(nn.Module):
    """An HF RMSNorm with TransformerLens's ``hook_normalized``: ``x * rsqrt(mean(x^2) + eps)``, before
    the weight. A weighted ``DeepseekV4RMSNorm`` is re-implemented op for op (float32, weight, cast
    back); an unweighted one (``q_b_norm``) is called and its output hooked."""

    def __init__(self, hf_norm: nn.Module):
        super().__init__()
        object.__setattr__(self, "hf", hf_norm)
        self.hook_normalized = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        hf = self.hf
        if getattr(hf, "weight", None) is None:
            return self.hook_normalized(hf(x))
        dtype = x.dtype
        x = x.to(torch.float32)
        x = self.hook_normalized(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + hf.variance_epsilon))
        return (hf.weight * x).to(dtype)


def band_view(full: Tensor, band: int, fill: float) -> Tensor:
    """The key slots ``[..., T + E]`` (T tokens, then E entries) of HF's attention as phaseinterp's key
    layout ``[..., band + E]``: slot ``s < band`` of query ``t`` is token ``t - band + 1 + s`` (``fill``
    before the sequence start), then the entries (docs/hooks.md)."""
    T = full.shape[-2]
    padded = F.pad(full[..., :T], (band - 1, 0), value=fill)
    idx = torch.arange(T, device=full.device)[:, None] + torch.arange(band, device=full.device)
    tokens = padded.gather(-1, idx.expand(*full.shape[:-1], band))
    return torch.cat([tokens, full[..., T:]], dim=-1)


def from_band_view(full: Tensor, view: Tensor, band: int) -> Tensor:
    """``full`` with the slots `band_view` shows replaced by ``view`` (an edit through the band layout);
    token slots outside the band keep their (masked) values."""
    T = full.shape[-2]
    padded = F.pad(full[..., :T], (band - 1, 0))
    idx = torch.arange(T, device=full.device)[:, None] + torch.arange(band, device=full.device)
    tokens = padded.scatter(-1, idx.expand(*full.shape[:-1], band), view[..., :band].to(full.dtype))
    return torch.cat([tokens[..., band - 1:], view[..., band:].to(full.dtype)], dim=-1)


def _hooked(hook: HookPoint) -> bool:
    return bool(hook._forward_hooks or hook._backward_hooks)


class AttentionHooks(nn.Module):
    """HF ``DeepseekV4Attention`` (eager): shared-KV MQA over sliding-window tokens + compressed entries."""

    def __init__(self, hf_attention: nn.Module, layer: int):
        super().__init__()
        object.__setattr__(self, "hf", hf_attention)
        self.layer = layer
        kind = hf_attention.layer_type
        self.compressor = CompressorHooks(hf_attention.compressor, kind) if kind != SLIDING else _NoCompressor(layer)
        self.q_norm = NormHooks(hf_attention.q_b_norm)
        self.kv_norm = NormHooks(hf_attention.kv_norm)
        self.hook_q = HookPoint()
        self.hook_rot_q = HookPoint()
        self.hook_kv = HookPoint()
        self.hook_rot_kv = HookPoint()
        self.hook_attn_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()

    def forward(self, x: Tensor, position_embeddings: dict, position_ids: Tensor, mask: Optional[Tensor]) -> Tensor:
        hf = self.hf
        mod = _hf()
        batch, T, _ = x.shape
        d = hf.head_dim
        cos, sin = position_embeddings[hf.rope_layer_type]
        q_residual = hf.q_a_norm(hf.q_a_proj(x))
        q = self.q_norm(self.hook_q(hf.q_b_proj(q_residual).view(batch, T, -1, d)))
        q = self.hook_rot_q(mod.apply_rotary_pos_emb(q.transpose(1, 2), cos, sin).transpose(1, 2)).transpose(1, 2)
        kv = self.kv_norm(self.hook_kv(hf.kv_proj(x).view(batch, T, -1, d)))
        kv = self.hook_rot_kv(mod.apply_rotary_pos_emb(kv.transpose(1, 2), cos, sin).transpose(1, 2)).transpose(1, 2)
        block_bias = None
        if isinstance(self.compressor, CompressorHooks):
            compressed_kv, block_bias = self.compressor(x, q_residual, position_ids)
            kv = torch.cat([kv, compressed_kv], dim=2)  # key slots: T tokens, then the entries
        if isinstance(mask, Tensor) and kv.shape[2] > mask.shape[-1]:
            if block_bias is not None:
                mask = torch.cat([mask, block_bias.to(mask.dtype)], dim=-1)
            else:
                mask = F.pad(mask, (0, kv.shape[2] - mask.shape[-1]), value=0.0)
        # eager_attention_forward, with the learned per-head sink as an extra logit.
        keys = mod.repeat_kv(kv, hf.num_key_value_groups)  # [batch, head, key_slot, d]; K = V
        scores = torch.matmul(q, keys.transpose(2, 3)) * hf.scaling
        if mask is not None:
            scores = scores + mask
        band = hf.config.sliding_window  # the hooks show phaseinterp's key layout: band, then entries
        if _hooked(self.hook_attn_scores):
            scores = from_band_view(scores, self.hook_attn_scores(band_view(scores, band, float("-inf"))), band)
        sinks = hf.sinks.reshape(1, -1, 1, 1).expand(batch, -1, T, -1)
        logits = torch.cat([scores, sinks], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = F.softmax(logits, dim=-1, dtype=logits.dtype)
        pattern = probs[..., :-1]
        if _hooked(self.hook_pattern):
            pattern = from_band_view(pattern, self.hook_pattern(band_view(pattern, band, 0.0)), band)
        pattern = F.dropout(pattern, p=hf.attention_dropout if self.training else 0.0, training=self.training)
        z = torch.matmul(pattern.to(keys.dtype), keys).transpose(1, 2).contiguous()  # [batch, pos, head, d]
        # K = V carries RoPE on its rope slice: rotate the output back by the query position.
        z = mod.apply_rotary_pos_emb(z.transpose(1, 2), cos, -sin).transpose(1, 2)
        z = self.hook_z(z)
        grouped = hf.o_a_proj(z.reshape(batch, T, hf.config.o_groups, -1)).flatten(2)
        return hf.o_b_proj(grouped)


class BlockHooks(nn.Module):
    """HF ``DeepseekV4DecoderLayer``: mHC collapse -> attention -> mHC mix, then the same around the MoE."""

    def __init__(self, hf_layer: nn.Module, layer: int):
        super().__init__()
        object.__setattr__(self, "hf", hf_layer)
        self.ln1 = NormHooks(hf_layer.input_layernorm)
        self.attn = AttentionHooks(hf_layer.self_attn, layer)
        self.ln2 = NormHooks(hf_layer.post_attention_layernorm)
        for name in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"):
            setattr(self, name, HookPoint())

    def forward(self, streams: Tensor, position_embeddings: dict, position_ids: Tensor, mask, input_ids) -> Tensor:
        hf = self.hf
        dtype = streams.dtype
        streams = self.hook_resid_pre(streams)
        post, comb, collapsed = hf.attn_hc(streams)
        attn_out = self.attn(self.ln1(collapsed), position_embeddings, position_ids, mask)
        attn_out = self.hook_attn_out(attn_out)
        streams = post.to(dtype).unsqueeze(-1) * attn_out.unsqueeze(-2) + torch.matmul(
            comb.to(dtype).transpose(-1, -2), streams)
        streams = self.hook_resid_mid(streams)
        post, comb, collapsed = hf.ffn_hc(streams)
        mlp_out = self.hook_mlp_out(hf.mlp(self.ln2(collapsed), input_ids=input_ids))
        streams = post.to(dtype).unsqueeze(-1) * mlp_out.unsqueeze(-2) + torch.matmul(
            comb.to(dtype).transpose(-1, -2), streams)
        return self.hook_resid_post(streams)
