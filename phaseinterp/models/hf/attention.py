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

from phaseinterp.models.hf.chunking import TOKEN_BLOCK, chunk_ranges, is_chunked
from phaseinterp.models.paths import has_hooks, query_context
from phaseinterp.models.hf.compressor import CompressorHooks, _hf, _NoCompressor
from phaseinterp.models.hf.config import CSA, SLIDING


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
        self.query_chunk = "auto"  # an execution setting (`HookedDeepseekV4.set_query_chunk`), not a weight

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
        if is_chunked(self.query_chunk, T):
            z = self._attend_chunked(q, kv[:, 0], x, q_residual, position_ids, cos, sin)
        else:
            z = self._attend_dense(q, kv, x, q_residual, position_ids, cos, sin, mask)
        with query_context([self.hook_z], 0, T):
            z = self.hook_z(z)
        grouped = hf.o_a_proj(z.reshape(batch, T, hf.config.o_groups, -1)).flatten(2)
        return hf.o_b_proj(grouped)

    def _attend_dense(self, q: Tensor, kv: Tensor, x: Tensor, q_residual: Tensor, position_ids: Tensor,
                      cos: Tensor, sin: Tensor, mask) -> Tensor:
        """transformers' eager attention over all ``T`` queries at once (the ``[T, T + entries]`` scores):
        ``z`` ``[batch, pos, head, d_head]`` before ``hook_z``."""
        hf = self.hf
        mod = _hf()
        batch, T = x.shape[:2]
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
        if has_hooks(self.hook_attn_scores):
            scores = from_band_view(scores, self.hook_attn_scores(band_view(scores, band, float("-inf"))), band)
        sinks = hf.sinks.reshape(1, -1, 1, 1).expand(batch, -1, T, -1)
        logits = torch.cat([scores, sinks], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = F.softmax(logits, dim=-1, dtype=logits.dtype)
        pattern = probs[..., :-1]
        if has_hooks(self.hook_pattern):
            pattern = from_band_view(pattern, self.hook_pattern(band_view(pattern, band, 0.0)), band)
        pattern = F.dropout(pattern, p=hf.attention_dropout if self.training else 0.0, training=self.training)
        z = torch.matmul(pattern.to(keys.dtype), keys).transpose(1, 2).contiguous()  # [batch, pos, head, d]
        # K = V carries RoPE on its rope slice: rotate the output back by the query position.
        return mod.apply_rotary_pos_emb(z.transpose(1, 2), cos, -sin).transpose(1, 2)

    def _attend_chunked(self, q: Tensor, kv: Tensor, x: Tensor, q_residual: Tensor, position_ids: Tensor,
                        cos: Tensor, sin: Tensor) -> Tensor:
        """The same attention in query chunks, each chunk against only the keys it can see: ``z``
        ``[batch, pos, head, d_head]`` before ``hook_z``, equal to `_attend_dense` (tests/test_dsv4_long.py).

        ``q`` ``[batch, head, pos, d]`` and ``kv`` ``[batch, pos, d]`` (one K = V head) are rotated. Per chunk
        of queries ``a..b-1``: the band (query ``t`` sees tokens ``t - B + 1 .. t``, gathered per query), then
        the compressed entries: HCA every entry closed by ``b - 1`` (those closed later masked per query);
        CSA the indexer's top-k of each query, gathered (`IndexerHooks.select`, itself chunked). While
        ``hook_attn_scores`` or ``hook_pattern`` has a hook, a chunk's scores are laid out as the dense
        forward lays them out (band, then EVERY entry of the prompt, -inf where not visible or not
        selected), so those hooks see and edit phaseinterp's key layout, one query chunk per call
        (``hook.ctx["query_range"] = (a, b)``); the numbers are the same either way.
        """
        hf = self.hf
        mod = _hf()
        batch, H, T, d = q.shape
        band = hf.config.sliding_window
        comp = self.compressor
        entries = selected = None
        S = None
        if isinstance(comp, CompressorHooks):
            S = comp.compress_rate
            entries = comp.compress(x)  # [batch, E, d], rotated; the compressor's hooks fire once, full shape
            if comp.kind == CSA:
                selected = comp.indexer.select(x, q_residual, position_ids, self.query_chunk)  # [batch, T, k]
        E = 0 if entries is None else entries.shape[1]
        hooked = has_hooks(self.hook_attn_scores) or has_hooks(self.hook_pattern)
        if entries is None:
            slots = band
        elif hooked or comp.kind != CSA:
            slots = band + E
        else:
            slots = band + selected.shape[-1]
        per_query = batch * max(H * (slots + 1), slots * d)
        z = q.new_empty((batch, T, H, d))
        pos = position_ids[0]
        for a, b in chunk_ranges(T, per_query, self.query_chunk):
            C = b - a
            t = pos[a:b]
            # band: slot s of query t is token t - band + 1 + s (masked before the sequence start)
            source = t[:, None] - band + 1 + torch.arange(band, device=q.device)
            band_keys = kv[:, source.clamp(min=0)]  # [batch, C, band, d]
            qc = q[:, :, a:b]
            scores = [torch.einsum("bhcd,bcsd->bhcs", qc, band_keys) * hf.scaling]
            scores[0] = scores[0].masked_fill((source < 0)[None, None], float("-inf"))
            entry_keys = None
            if entries is not None:
                closed = (t + 1) // S  # entries j < closed are closed at query t
                if comp.kind != CSA or hooked:
                    n = E if hooked else int(b // S)
                    entry_keys = entries[:, :n]
                    visible = torch.arange(n, device=q.device)[None, :] < closed[:, None]  # [C, n]
                    if comp.kind == CSA:
                        chosen = selected[:, a:b]
                        picked = torch.zeros((batch, C, n + 1), dtype=torch.bool, device=q.device)
                        picked.scatter_(-1, torch.where(chosen >= 0, chosen, n), True)
                        visible = visible[None] & picked[..., :n]
                    else:
                        visible = visible[None].expand(batch, -1, -1)
                    s_e = torch.einsum("bhcd,bnd->bhcn", qc, entry_keys) * hf.scaling
                else:
                    chosen = selected[:, a:b]  # [batch, C, k]; -1: none
                    visible = chosen >= 0
                    entry_keys = torch.gather(entries[:, None].expand(-1, C, -1, -1), 2,
                                              chosen.clamp(min=0)[..., None].expand(-1, -1, -1, d))  # [batch, C, k, d]
                    s_e = torch.einsum("bhcd,bckd->bhck", qc, entry_keys) * hf.scaling
                scores.append(s_e.masked_fill(~visible[:, None], float("-inf")))
            scores = torch.cat(scores, dim=-1)
            with query_context((self.hook_attn_scores, self.hook_pattern), a, b):
                if has_hooks(self.hook_attn_scores):
                    scores = self.hook_attn_scores(scores)
                sinks = hf.sinks.reshape(1, -1, 1, 1).expand(batch, -1, C, -1)
                logits = torch.cat([scores, sinks], dim=-1)
                logits = logits - logits.max(dim=-1, keepdim=True).values
                pattern = F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]
                if has_hooks(self.hook_pattern):
                    pattern = self.hook_pattern(pattern)
            pattern = F.dropout(pattern, p=hf.attention_dropout if self.training else 0.0, training=self.training)
            pattern = pattern.to(kv.dtype)
            zc = torch.einsum("bhcs,bcsd->bchd", pattern[..., :band], band_keys)
            if entry_keys is not None:
                spec = "bhcn,bnd->bchd" if entry_keys.ndim == 3 else "bhck,bckd->bchd"
                zc = zc + torch.einsum(spec, pattern[..., band:], entry_keys)
            # K = V carries RoPE on its rope slice: rotate the output back by the query position.
            z[:, a:b] = mod.apply_rotary_pos_emb(zc.transpose(1, 2), cos[:, a:b], -sin[:, a:b]).transpose(1, 2)
        return z


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
        self.query_chunk = "auto"  # chunked forwards also run the per-token parts in TOKEN_BLOCK blocks

    def forward(self, streams: Tensor, position_embeddings: dict, position_ids: Tensor, mask, input_ids) -> Tensor:
        hf = self.hf
        T = streams.shape[1]
        blocks = [(a, min(a + TOKEN_BLOCK, T)) for a in range(0, T, TOKEN_BLOCK)] \
            if is_chunked(self.query_chunk, T) else [(0, T)]
        streams = self.hook_resid_pre(streams)
        # mHC collapse and mix act per token: in token blocks, their float32 copies stay bounded
        parts = [hf.attn_hc(streams[:, a:b]) for a, b in blocks]
        collapsed = torch.cat([c for _, _, c in parts], dim=1) if len(parts) > 1 else parts[0][2]
        attn_out = self.attn(self.ln1(collapsed), position_embeddings, position_ids, mask)
        del collapsed
        attn_out = self.hook_attn_out(attn_out)
        streams = self._mix(parts, attn_out, streams, blocks)
        streams = self.hook_resid_mid(streams)
        parts = [hf.ffn_hc(streams[:, a:b]) for a, b in blocks]
        x = self.ln2(torch.cat([c for _, _, c in parts], dim=1) if len(parts) > 1 else parts[0][2])
        # the MoE acts per token: in token blocks, its routing and expert intermediates stay bounded
        mlp_out = [hf.mlp(x[:, a:b], input_ids=input_ids[:, a:b]) for a, b in blocks]
        del x
        mlp_out = self.hook_mlp_out(torch.cat(mlp_out, dim=1) if len(mlp_out) > 1 else mlp_out[0])
        streams = self._mix(parts, mlp_out, streams, blocks)
        return self.hook_resid_post(streams)

    @staticmethod
    def _mix(parts, out: Tensor, streams: Tensor, blocks) -> Tensor:
        """mHC expand + mix, ``post * out + comb^T streams``, per token block."""
        dtype = streams.dtype
        mixed = [post.to(dtype).unsqueeze(-1) * out[:, a:b].unsqueeze(-2) + torch.matmul(
            comb.to(dtype).transpose(-1, -2), streams[:, a:b]) for (post, comb, _), (a, b) in zip(parts, blocks)]
        return torch.cat(mixed, dim=1) if len(mixed) > 1 else mixed[0]
