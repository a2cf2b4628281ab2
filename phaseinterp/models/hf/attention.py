"""Attention and decoder block of `HookedDeepseekV4`: HF's DeepSeek-V4 layer forward, hooked.

Line-by-line re-implementations of HF's ``DeepseekV4Attention`` (eager) and
``DeepseekV4DecoderLayer`` over the HF modules' own parameters, with the ``blocks.{l}.*``
HookPoints (shapes: `phaseinterp.models.hf.deepseek_v4`).
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


class AttentionHooks(nn.Module):
    """HF ``DeepseekV4Attention`` (eager): shared-KV MQA over sliding-window tokens + compressed entries."""

    def __init__(self, hf_attention: nn.Module, layer: int):
        super().__init__()
        object.__setattr__(self, "hf", hf_attention)
        self.layer = layer
        kind = hf_attention.layer_type
        self.compressor = CompressorHooks(hf_attention.compressor, kind) if kind != SLIDING else _NoCompressor(layer)
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
        q = self.hook_q(hf.q_b_norm(hf.q_b_proj(q_residual).view(batch, T, -1, d)))
        q = self.hook_rot_q(mod.apply_rotary_pos_emb(q.transpose(1, 2), cos, sin).transpose(1, 2)).transpose(1, 2)
        kv = self.hook_kv(hf.kv_norm(hf.kv_proj(x)).view(batch, T, -1, d))
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
        scores = self.hook_attn_scores(scores)
        sinks = hf.sinks.reshape(1, -1, 1, 1).expand(batch, -1, T, -1)
        logits = torch.cat([scores, sinks], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = F.softmax(logits, dim=-1, dtype=logits.dtype)
        pattern = self.hook_pattern(probs[..., :-1])
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
        self.attn = AttentionHooks(hf_layer.self_attn, layer)
        for name in ("hook_resid_pre", "hook_attn_in", "hook_attn_out", "hook_resid_mid", "hook_mlp_in",
                     "hook_mlp_out", "hook_resid_post"):
            setattr(self, name, HookPoint())

    def forward(self, streams: Tensor, position_embeddings: dict, position_ids: Tensor, mask, input_ids) -> Tensor:
        hf = self.hf
        dtype = streams.dtype
        streams = self.hook_resid_pre(streams)
        post, comb, collapsed = hf.attn_hc(streams)
        attn_out = self.attn(self.hook_attn_in(hf.input_layernorm(collapsed)), position_embeddings, position_ids, mask)
        attn_out = self.hook_attn_out(attn_out)
        streams = post.to(dtype).unsqueeze(-1) * attn_out.unsqueeze(-2) + torch.matmul(
            comb.to(dtype).transpose(-1, -2), streams)
        streams = self.hook_resid_mid(streams)
        post, comb, collapsed = hf.ffn_hc(streams)
        mlp_out = self.hook_mlp_out(hf.mlp(self.hook_mlp_in(hf.post_attention_layernorm(collapsed)), input_ids=input_ids))
        streams = post.to(dtype).unsqueeze(-1) * mlp_out.unsqueeze(-2) + torch.matmul(
            comb.to(dtype).transpose(-1, -2), streams)
        return self.hook_resid_post(streams)
