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

from phaseinterp.models.hf.cache import LayerCache
from phaseinterp.models.hf.chunking import TOKEN_BLOCK, chunk_ranges, is_chunked
from phaseinterp.models.hf.compressor import CompressorHooks, _hf, _NoCompressor
from phaseinterp.models.paths import has_hooks, query_context
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


def attend(hf, q: Tensor, query_range: tuple[int, int], kv: Tensor, kv_offset: int, entries: Optional[Tensor],
           stride: Optional[int], chosen: Optional[Tensor], cos: Tensor, sin: Tensor, *, every_entry: bool = False,
           hooks: tuple = (), training: bool = False) -> Tensor:
    """DeepSeek-V4's attention (transformers' ``DeepseekV4Attention``, eager) for the queries at positions
    ``a .. b - 1`` (``query_range``), against only the keys they can see: the one implementation the full
    forward (per query chunk), the last-position engine and the knockouts run.

    ``q`` ``[batch, head, C, d]`` rotated queries (``C = b - a``); ``kv`` ``[batch, L, d]`` the rotated
    per-token K = V of positions ``kv_offset ..``; ``entries`` ``[batch, E, d]`` the rotated compressed
    entries (``None``: a sliding-window layer), ``stride`` their rate; ``chosen`` ``[batch, C, k]`` the
    indexer's top-k per query (-1: none; CSA only, ``None`` on HCA, where every closed entry is visible).
    ``cos``, ``sin``: the queries' rotary tables (the output is rotated back by them, as K = V carries
    RoPE). Key slots per query ``t``: the band, slot ``s`` = token ``t - band + 1 + s`` (-inf before
    the sequence start), then the entries: the ``k`` chosen, gathered (CSA; while ``k`` can hold every
    entry closed by ``b - 1``, those entries masked to the chosen instead), those closed by ``b - 1``
    (HCA), or,
    with ``every_entry``, every entry of ``entries`` (-inf where not visible or not chosen: the layout
    `hook_attn_scores` and `hook_pattern` show, docs/hooks.md). ``hooks``: ``(hook_attn_scores,
    hook_pattern)``, each called with ``ctx["query_range"] = (a, b)`` when it has a hook. The learned
    per-head sink is one more logit of the softmax. Returns ``z`` ``[batch, C, head, d]``."""
    a, b = query_range
    batch, H, C, d = q.shape
    band = hf.config.sliding_window
    t = torch.arange(a, b, device=q.device)
    source = t[:, None] - band + 1 + torch.arange(band, device=q.device)  # [C, band] absolute positions
    # query c's band keys are rows c .. c + band - 1 of one window of kv: a strided view, no copy
    lo, hi = a - band + 1 - kv_offset, b - kv_offset
    window = kv[:, max(lo, 0):hi]
    if lo < 0:  # positions before kv's first: zero rows, their scores masked (-inf) below
        window = F.pad(window, (0, 0, -lo, 0))
    band_keys = window.unfold(1, band, 1)  # [batch, C, d, band]
    # One [batch, head, C, key_slots + 1] logit block per query chunk, each part's scaled scores written
    # into its slice (no concatenation copies), the sink its last column; masks only where a key is hidden.
    entry_keys = None
    slots = band
    if entries is not None:
        closed = (t + 1) // stride  # entries j < closed are closed at query t
        E = entries.shape[1]
        n_closed = min(E, b // stride)  # entries closed by the chunk's last query
        # every closed entry as a key of every query, masked: for HCA, for a hook, and for CSA while the
        # top-k can hold every closed entry (gathering k entries per query would copy more than it saves)
        if chosen is None or every_entry or n_closed <= chosen.shape[-1]:
            n = E if every_entry else n_closed
            entry_keys = entries[:, :n]
        else:
            n = chosen.shape[-1]
            rows = chosen.clamp(min=0) + E * torch.arange(batch, device=q.device).view(-1, 1, 1)
            entry_keys = entries.reshape(batch * E, d).index_select(0, rows.view(-1)).view(*chosen.shape, d)  # [batch, C, k, d]
        slots += n
    # without autograd each part is scaled straight into its slice of the block; with it (or where the
    # float32 sinks promote the scores' dtype, as transformers' concatenation does), concatenated
    fill = not torch.is_grad_enabled() and torch.promote_types(q.dtype, hf.sinks.dtype) == q.dtype
    logits = q.new_empty((batch, H, C, slots + 1)) if fill else None
    parts = []

    def put(spec, keys, lo, hi, hidden, logits=logits, parts=parts):
        """The scaled scores of slots ``lo .. hi - 1``, -inf where ``hidden`` (None: none hidden)."""
        if logits is not None:
            part = torch.mul(torch.einsum(spec, q, keys), hf.scaling, out=logits[..., lo:hi])
        else:
            part = torch.einsum(spec, q, keys) * hf.scaling
            parts.append(part)
        if hidden is not None:
            part.masked_fill_(hidden, float("-inf"))

    put("bhcd,bcds->bhcs", band_keys, 0, band, (source < 0)[None, None] if a - band + 1 < 0 else None)
    if entry_keys is not None:
        if entry_keys.ndim == 3:
            hidden = torch.arange(n, device=q.device)[None, :] >= closed[:, None]  # [C, n]
            if chosen is not None:
                picked = torch.zeros((batch, C, n + 1), dtype=torch.bool, device=q.device)
                picked.scatter_(-1, torch.where(chosen >= 0, chosen, n), True)
                hidden = (hidden[None] | ~picked[..., :n])[:, None]
                del picked
            else:
                hidden = hidden[None, None] if bool(hidden.any()) else None
            put("bhcd,bnd->bhcn", entry_keys, band, slots, hidden)
        else:
            hidden = chosen < 0
            put("bhcd,bckd->bhck", entry_keys, band, slots, hidden[:, None] if bool(hidden.any()) else None)
        del hidden
    sinks = hf.sinks.reshape(1, -1, 1, 1)
    if fill:
        logits[..., slots:] = sinks
    else:
        logits = torch.cat(parts + [sinks.expand(batch, -1, C, -1)], dim=-1)
    del parts
    score_hook, pattern_hook = hooks if hooks else (None, None)
    with query_context([h for h in hooks if h is not None], a, b):
        if score_hook is not None and has_hooks(score_hook):
            scores = score_hook(logits[..., :slots].contiguous())
            logits = torch.cat([scores, sinks.expand(batch, -1, C, -1)], dim=-1)
            del scores
        logits = logits.sub_(logits.max(dim=-1, keepdim=True).values) if fill else \
            logits - logits.max(dim=-1, keepdim=True).values
        pattern = F.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]
        del logits
        if pattern_hook is not None and has_hooks(pattern_hook):
            pattern = pattern_hook(pattern)
    pattern = F.dropout(pattern, p=hf.attention_dropout if training else 0.0, training=training).to(kv.dtype)
    z = torch.einsum("bhcs,bcds->bchd", pattern[..., :band], band_keys)
    if entry_keys is not None:
        spec = "bhcn,bnd->bchd" if entry_keys.ndim == 3 else "bhck,bckd->bchd"
        z = z + torch.einsum(spec, pattern[..., band:], entry_keys)
    del pattern
    # K = V carries RoPE on its rope slice: rotate the output back by the query position.
    return _hf().apply_rotary_pos_emb(z.transpose(1, 2), cos, -sin).transpose(1, 2)


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

    def forward(self, x: Tensor, position_embeddings: dict, position_ids: Tensor, cache: Optional[LayerCache],
                variants: Optional[int] = None, cache_only: bool = False) -> tuple[Optional[Tensor], LayerCache]:
        """The attention output ``[batch, n, d_model]`` of ``x`` ``[batch, n, d_model]``, the tokens at
        ``position_ids`` ``[1, n]`` (``start .. start + n - 1``) after ``cache`` (None: ``start`` is 0),
        and the layer's cache extended by them. ``variants``: ``x`` holds that many rows per cached row
        (`KVCache.fork`), the cache is read, not extended (the returned one is the variants').
        ``cache_only``: the cache alone (K = V, the compressor's and the indexer's entries); no query,
        selection or output (None): only the hooks of what the cache keeps fire."""
        hf = self.hf
        mod = _hf()
        batch, n, _ = x.shape
        d = hf.head_dim
        start = int(position_ids[0, 0])
        if cache is not None and variants is not None and variants > 1:
            cache = cache.map(lambda t: t.repeat_interleave(variants, 0))  # row r continues row r // variants
        cos, sin = position_embeddings[hf.rope_layer_type]
        if not cache_only:
            q_residual = hf.q_a_norm(hf.q_a_proj(x))
            q = self.q_norm(self.hook_q(hf.q_b_proj(q_residual).view(batch, n, -1, d)))
            q = self.hook_rot_q(mod.apply_rotary_pos_emb(q.transpose(1, 2), cos, sin).transpose(1, 2)).transpose(1, 2)
        kv = self.kv_norm(self.hook_kv(hf.kv_proj(x).view(batch, n, -1, d)))
        kv = self.hook_rot_kv(mod.apply_rotary_pos_emb(kv.transpose(1, 2), cos, sin).transpose(1, 2))[:, :, 0]
        keys = kv if cache is None else torch.cat([cache.kv, kv], dim=1)  # positions start - len(cache.kv) ..
        comp = self.compressor
        entries = selected = stride = state = index_state = None
        if isinstance(comp, CompressorHooks):
            stride = comp.compress_rate
            entries, state = comp.extend(x, start, None if cache is None else cache.compressor)
            if comp.kind == CSA:
                index_entries, index_state = comp.indexer.extend(x, start, None if cache is None else cache.indexer)
                if not cache_only:
                    selected = comp.indexer.select(x, q_residual, position_ids, index_entries, self.query_chunk)
        # what later queries' bands read: a copy of those rows, so the call's K = V is freed with it
        tail = keys[:, max(0, keys.shape[1] - (hf.config.sliding_window - 1)):].clone()
        if cache_only:
            return None, LayerCache(start + n, tail, state, index_state)
        z = self._attend(q, keys, start + n - keys.shape[1], entries, stride, selected, cos, sin, start)
        z = self.hook_z(z)
        grouped = hf.o_a_proj(z.reshape(batch, n, hf.config.o_groups, -1)).flatten(2)
        return hf.o_b_proj(grouped), LayerCache(start + n, tail, state, index_state)

    def _attend(self, q: Tensor, kv: Tensor, kv_offset: int, entries: Optional[Tensor], stride: Optional[int],
                selected: Optional[Tensor], cos: Tensor, sin: Tensor, start: int) -> Tensor:
        """`attend` over the call's queries (positions ``start ..``), in the query chunks of
        `chunking.chunk_ranges` (``query_chunk`` None: one chunk): ``z`` ``[batch, n, head, d_head]``
        before ``hook_z``, equal to transformers' eager forward.

        ``q`` ``[batch, head, n, d]`` and ``kv`` ``[batch, L, d]`` (one K = V head, positions ``kv_offset
        ..``) are rotated; ``entries`` the compressor's entries closed by the call's last query;
        ``selected`` a CSA layer's top-k per query. While ``hook_attn_scores`` or ``hook_pattern`` has a
        hook, a chunk's scores are laid out with EVERY entry of ``entries`` (-inf where not visible or not
        selected), one query chunk per call (``hook.ctx["query_range"]``); the numbers are the same
        either way."""
        hf = self.hf
        batch, H, n, d = q.shape
        band = hf.config.sliding_window
        E = 0 if entries is None else entries.shape[1]
        hooked = has_hooks(self.hook_attn_scores) or has_hooks(self.hook_pattern)
        slots = band + (0 if entries is None else E if hooked or selected is None else selected.shape[-1])
        per_query = max(H * (slots + 1), slots * d)  # one prompt row: the chunks never depend on the batch
        ranges = [(0, n)] if self.query_chunk is None else chunk_ranges(n, per_query, self.query_chunk)
        z = q.new_empty((batch, n, H, d))
        for a, b in ranges:
            z[:, a:b] = attend(hf, q[:, :, a:b], (start + a, start + b), kv, kv_offset, entries, stride,
                               None if selected is None else selected[:, a:b], cos[:, a:b], sin[:, a:b],
                               every_entry=hooked, hooks=(self.hook_attn_scores, self.hook_pattern),
                               training=self.training)
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

    def forward(self, streams: Tensor, position_embeddings: dict, position_ids: Tensor, input_ids: Optional[Tensor],
                cache: Optional[LayerCache] = None, variants: Optional[int] = None,
                cache_only: bool = False) -> tuple[Tensor, LayerCache]:
        """The layer's output streams for ``streams`` ``[batch, n, hc, d_model]`` at ``position_ids``
        after ``cache`` (`AttentionHooks.forward`), and the layer's extended cache. ``input_ids``
        ``[batch, n]``: the tokens there, which a hash-routed MoE layer reads (None elsewhere).
        ``cache_only``: the cache alone; the input streams come back unchanged."""
        hf = self.hf
        n = streams.shape[1]
        blocks = [(a, min(a + TOKEN_BLOCK, n)) for a in range(0, n, TOKEN_BLOCK)] \
            if is_chunked(self.query_chunk, n) else [(0, n)]
        streams = self.hook_resid_pre(streams)
        # mHC collapse and mix act per token: in token blocks, their float32 copies stay bounded
        parts = [hf.attn_hc(streams[:, a:b]) for a, b in blocks]
        collapsed = torch.cat([c for _, _, c in parts], dim=1) if len(parts) > 1 else parts[0][2]
        attn_out, cache = self.attn(self.ln1(collapsed), position_embeddings, position_ids, cache, variants, cache_only)
        if cache_only:
            return streams, cache
        del collapsed
        attn_out = self.hook_attn_out(attn_out)
        streams = self._mix(parts, attn_out, streams, blocks)
        streams = self.hook_resid_mid(streams)
        parts = [hf.ffn_hc(streams[:, a:b]) for a, b in blocks]
        x = self.ln2(torch.cat([c for _, _, c in parts], dim=1) if len(parts) > 1 else parts[0][2])
        # the MoE acts per token: in token blocks, its routing and expert intermediates stay bounded
        # (contiguous: transformers' MoE views its input flat, which a block of a batch > 1 is not)
        ids = (lambda a, b: None) if input_ids is None else (lambda a, b: input_ids[:, a:b].contiguous())
        mlp_out = [hf.mlp(x[:, a:b].contiguous(), input_ids=ids(a, b)) for a, b in blocks]
        del x
        mlp_out = self.hook_mlp_out(torch.cat(mlp_out, dim=1) if len(mlp_out) > 1 else mlp_out[0])
        streams = self._mix(parts, mlp_out, streams, blocks)
        return self.hook_resid_post(streams), cache

    @staticmethod
    def _mix(parts, out: Tensor, streams: Tensor, blocks) -> Tensor:
        """mHC expand + mix, ``post * out + comb^T streams``, per token block."""
        dtype = streams.dtype
        mixed = [post.to(dtype).unsqueeze(-1) * out[:, a:b].unsqueeze(-2) + torch.matmul(
            comb.to(dtype).transpose(-1, -2), streams[:, a:b]) for (post, comb, _), (a, b) in zip(parts, blocks)]
        return torch.cat(mixed, dim=1) if len(mixed) > 1 else mixed[0]
