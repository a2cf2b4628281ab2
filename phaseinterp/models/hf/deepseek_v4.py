"""`HookedDeepseekV4`: Hugging Face's DeepSeek-V4 in phaseinterp's model protocol, with hooks.

The wrapper owns no weights: every parameter is the HF module's own. Its forward is a
line-by-line re-implementation of `transformers.models.deepseek_v4` (5.24, eager
attention, no KV cache) that calls the same submodules and parameters, with HookPoints
where the paper's quantities appear; tests/test_deepseek_v4.py checks it against the plain
HF forward to 1e-6. Hook names (TransformerLens's where the concept matches):

    hook_embed                                     [batch, pos, d_model]
    blocks.{l}.hook_resid_pre / _mid / _post       [batch, pos, hc_stream, d_model]  (mHC: hc_mult streams)
    blocks.{l}.hook_attn_in / hook_mlp_in          [batch, pos, d_model]  collapsed + RMS-normed block input
    blocks.{l}.hook_attn_out / hook_mlp_out        [batch, pos, d_model]
    blocks.{l}.attn.hook_q / hook_rot_q            [batch, pos, head, d_head]   (before / after RoPE)
    blocks.{l}.attn.hook_kv / hook_rot_kv          [batch, pos, kv_head=1, d_head]  per-token K = V
    blocks.{l}.attn.hook_attn_scores / hook_pattern  [batch, head, query_pos, key_slot]  (sink dropped)
    blocks.{l}.attn.hook_z                         [batch, pos, head, d_head]  before the output projection
    blocks.{l}.attn.compressor.hook_kv             [batch, pos, half, d_head]   per-token payload (kv_proj)
    blocks.{l}.attn.compressor.hook_token_gate_logits  [batch, pos, half, d_head]  gate_proj, before position_bias
    blocks.{l}.attn.compressor.hook_gate_logits_k/_v   [batch, entry, slot, kv_head=1, d_head]  + position_bias
    blocks.{l}.attn.compressor.hook_gate_k/_v      alpha, same shape (softmax over slot)
    blocks.{l}.attn.compressor.hook_compressed     [batch, entry, kv_head=1, d_head]  after kv_norm, before RoPE
    blocks.{l}.attn.compressor.hook_rot_compressed the same after RoPE (what attention reads)
    blocks.{l}.attn.compressor.indexer.hook_kv / hook_token_gate_logits / hook_gate_logits / hook_gate
    blocks.{l}.attn.compressor.indexer.hook_compressed / hook_rot_compressed  [batch, entry, d_index]
    blocks.{l}.attn.compressor.indexer.hook_q      [batch, pos, index_head, d_index]
    blocks.{l}.attn.compressor.indexer.hook_scores [batch, pos, entry]  (-inf for entries not yet closed)
    blocks.{l}.attn.compressor.indexer.hook_selected  [batch, pos, top_k] int64, -1 = no entry
    hook_final                                     [batch, pos, d_model]  hc_head + final norm

Layout (``half``, ``slot``): a CSA token has two halves; half 0 (HF's ``Ca``, the first
``head_dim`` channels of ``kv_proj``/``gate_proj``/``position_bias``) feeds the entry in
which the token is among the OLDER S tokens, half 1 (``Cb``) the entry in which it is among
the newer S. CSA entry ``j`` covers positions ``(j-1)S .. jS+S-1`` with slots ``0..S-1``
(older, half 0) then ``S..2S-1`` (newer, half 1); entry 0 is HF's leading partial entry
(tokens ``0..S-1``, newer half only; its older slots have logit -inf, alpha 0). HCA entry
``j`` covers ``jR .. jR+R-1`` (one half, R slots). An entry is visible from ``t >= (j+1)S - 1``
and (CSA) only if the indexer selects it. K = V: ``hook_gate_*_k`` and ``_v`` are one gate
seen twice (``_v`` receives ``_k``'s output), so tools written for separate K/V gates run.
Hooks only exist on compressed layers; sliding-window-only layers have no compressor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

import einops
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from phaseinterp.models.compressor import GateParameters
from phaseinterp.models.hf.config import CSA, HCA, SLIDING, DeepseekV4HookedConfig

SIDECAR_FILE = "phaseinterp.json"  # phaseinterp metadata (task, recipe) beside an HF checkpoint


def _hf():
    """The HF DeepSeek-V4 module (imported lazily: transformers is an optional extra, ``pip install phaseinterp[hf]``)."""
    try:
        from transformers.models.deepseek_v4 import modeling_deepseek_v4
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "DeepSeek-V4 support needs transformers>=5.24 (pip install 'phaseinterp[hf]')"
        ) from err
    return modeling_deepseek_v4


# ---------------------------------------------------------------------------------------------
# Compressors: HF's CSA / HCA / indexer compression, one function, hooked.
# ---------------------------------------------------------------------------------------------
class _CompressionHooks(nn.Module):
    """Hook points of one compressor (main or indexer) and its windowed compression maths.

    ``hf`` is the HF module (held, not registered: its weights belong to the HF model).
    """

    def __init__(self, hf_module: nn.Module, two_halves: bool, alias_kv_gates: bool):
        super().__init__()
        object.__setattr__(self, "hf", hf_module)
        self.two_halves = two_halves
        self.hook_kv = HookPoint()
        self.hook_token_gate_logits = HookPoint()
        if alias_kv_gates:
            self.hook_gate_logits_k = HookPoint()
            self.hook_gate_logits_v = HookPoint()
            self.hook_gate_k = HookPoint()
            self.hook_gate_v = HookPoint()
        else:
            self.hook_gate_logits = HookPoint()
            self.hook_gate = HookPoint()
        self.alias_kv_gates = alias_kv_gates
        self.hook_compressed = HookPoint()
        self.hook_rot_compressed = HookPoint()

    @property
    def position_bias(self) -> nn.Parameter:
        """HF's per-slot gate bias (the "ape"): ``[S, half * d_head]`` for CSA, ``[R, d_head]`` for HCA."""
        return self.hf.position_bias

    @property
    def compress_rate(self) -> int:
        return int(self.hf.compress_rate)

    def _gate_hooks(self, logits: Tensor) -> Tensor:
        if self.alias_kv_gates:
            logits = self.hook_gate_logits_v(self.hook_gate_logits_k(logits))
        else:
            logits = self.hook_gate_logits(logits)
        return logits

    def _alpha_hooks(self, alpha: Tensor) -> Tensor:
        if self.alias_kv_gates:
            return self.hook_gate_v(self.hook_gate_k(alpha))
        return self.hook_gate(alpha)

    def compress(self, x: Tensor) -> Tensor:
        """HF's stateless compression of every closed window of ``x`` ``[batch, pos, d_model]``.

        ``K_j = kv_norm(sum_i alpha_{j,i} * kv_{j,i})``, ``alpha_j = softmax_i(gate_{j,i} + position_bias_i)``
        over the entry's slots, then RoPE at position ``j * S``. Returns ``[batch, entry, d]`` (rotated).
        """
        hf = self.hf
        mod = _hf()
        batch, T, _ = x.shape
        d = hf.head_dim
        halves = 2 if self.two_halves else 1
        S = self.compress_rate
        kv = self.hook_kv(hf.kv_proj(x).view(batch, T, halves, d)).reshape(batch, T, halves * d)
        gate = self.hook_token_gate_logits(hf.gate_proj(x).view(batch, T, halves, d)).reshape(batch, T, halves * d)
        usable = (T // S) * S
        chunk_kv, chunk_gate = kv[:, :usable], gate[:, :usable]
        if chunk_kv.shape[1] == 0:
            return chunk_kv.new_zeros((batch, 0, d))
        n_windows = usable // S
        chunk_kv = chunk_kv.view(batch, n_windows, S, -1)
        chunk_gate = chunk_gate.view(batch, n_windows, S, -1) + hf.position_bias
        if self.two_halves:
            # Slots 0..S-1: the previous window's tokens (Ca, older half); S..2S-1: this window's (Cb).
            new_kv = chunk_kv.new_zeros((batch, n_windows, 2 * S, d))
            new_gate = chunk_gate.new_full((batch, n_windows, 2 * S, d), float("-inf"))
            new_kv[:, :, S:] = chunk_kv[..., d:]
            new_gate[:, :, S:] = chunk_gate[..., d:]
            if n_windows > 1:
                new_kv[:, 1:, :S] = chunk_kv[:, :-1, :, :d]
                new_gate[:, 1:, :S] = chunk_gate[:, :-1, :, :d]
        else:
            new_kv, new_gate = chunk_kv, chunk_gate
        new_gate = self._unsqueezed(self._gate_hooks, new_gate)
        alpha = new_gate.softmax(dim=2, dtype=torch.float32).to(new_kv.dtype)
        alpha = self._unsqueezed(self._alpha_hooks, alpha)
        compressed = hf.kv_norm((new_kv * alpha).sum(dim=2))
        compressed = self._unsqueezed(self.hook_compressed, compressed)
        positions = (torch.arange(n_windows, device=compressed.device) * S).unsqueeze(0).expand(batch, -1)
        cos, sin = hf.rotary_emb(compressed, position_ids=positions, layer_type=hf.rope_layer_type)
        compressed = mod.apply_rotary_pos_emb(compressed.unsqueeze(1), cos, sin).squeeze(1)
        return self._unsqueezed(self.hook_rot_compressed, compressed)

    def _unsqueezed(self, hook, t: Tensor) -> Tensor:
        # Main-compressor hooks carry the (single) KV-head axis; the indexer has none.
        if not self.alias_kv_gates:
            return hook(t)
        axis = 2 if t.ndim == 3 else 3
        return hook(t.unsqueeze(axis)).squeeze(axis)


class IndexerHooks(_CompressionHooks):
    """The Lightning Indexer: its own compressor, query heads, scores and top-k selection."""

    def __init__(self, hf_indexer: nn.Module):
        super().__init__(hf_indexer, two_halves=True, alias_kv_gates=False)
        self.hook_q = HookPoint()
        self.hook_scores = HookPoint()
        self.hook_selected = HookPoint()

    def forward(self, x: Tensor, q_residual: Tensor, position_ids: Tensor) -> Tensor:
        """Top-``index_topk`` entry indices per query ``[batch, pos, k]`` (-1 where fewer are closed)."""
        hf = self.hf
        mod = _hf()
        batch, T, _ = x.shape
        compressed = self.compress(x)  # [batch, entry, d_index]
        cos_q, sin_q = hf.rotary_emb(x, position_ids=position_ids, layer_type=hf.rope_layer_type)
        q = hf.q_b_proj(q_residual).view(batch, T, -1, hf.head_dim).transpose(1, 2)
        q = self.hook_q(mod.apply_rotary_pos_emb(q, cos_q, sin_q).transpose(1, 2))
        scores = hf.scorer(q, compressed, x)  # [batch, pos, entry]
        n_entries = compressed.shape[1]
        top_k = min(hf.index_topk, n_entries)
        if n_entries == 0:
            return self.hook_selected(self.hook_scores(scores).topk(top_k, dim=-1).indices)
        threshold = (position_ids + 1) // hf.compress_rate  # entries j < threshold are closed
        entry = torch.arange(n_entries, device=scores.device)
        scores = scores.masked_fill(entry.view(1, 1, -1) >= threshold.unsqueeze(-1), float("-inf"))
        scores = self.hook_scores(scores)
        top = scores.topk(top_k, dim=-1).indices
        top = torch.where(top >= threshold.unsqueeze(-1), torch.full_like(top, -1), top)
        return self.hook_selected(top)


class CompressorHooks(_CompressionHooks):
    """A CSA (two halves + indexer) or HCA (one half) compressor; returns entries and their mask."""

    def __init__(self, hf_compressor: nn.Module, kind: str):
        super().__init__(hf_compressor, two_halves=kind == CSA, alias_kv_gates=True)
        self.kind = kind
        self.indexer = IndexerHooks(hf_compressor.indexer) if kind == CSA else None

    def forward(self, x: Tensor, q_residual: Tensor, position_ids: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """Compressed K = V ``[batch, 1, entry, d_head]`` and the additive block bias
        ``[batch, 1, pos, entry]`` (0 = visible, -inf = not closed or not selected)."""
        batch, T, _ = x.shape
        compressed_kv = self.compress(x).unsqueeze(1)
        n_entries = compressed_kv.shape[2]
        S = self.compress_rate
        if self.kind == HCA:
            if T == 1 or n_entries == 0:
                return compressed_kv, None
            entry = torch.arange(n_entries, device=compressed_kv.device)
            threshold = (position_ids + 1) // S
            block_bias = compressed_kv.new_zeros((batch, 1, T, n_entries))
            block_bias = block_bias.masked_fill(entry.view(1, 1, 1, -1) >= threshold.unsqueeze(1).unsqueeze(-1),
                                                float("-inf"))
            return compressed_kv, block_bias
        top = self.indexer(x, q_residual, position_ids)
        valid = top >= 0
        safe = torch.where(valid, top, torch.full_like(top, n_entries))
        block_bias = compressed_kv.new_full((batch, 1, T, n_entries + 1), float("-inf"))
        block_bias.scatter_(-1, safe.unsqueeze(1), 0.0)
        return compressed_kv, block_bias[..., :n_entries]


class _NoCompressor(nn.Module):
    """Stand-in on sliding-window-only layers: asking for its gates is an error that says why."""

    def __init__(self, layer: int):
        super().__init__()
        self.layer = layer

    @property
    def position_bias(self):
        raise ValueError(f"layer {self.layer} is a sliding-window-only layer: it has no compressor or gates "
                         "(pass layers=model.cfg.compressed_layers)")


# ---------------------------------------------------------------------------------------------
# Attention and block
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
class HookedDeepseekV4(HookedRootModule):
    """A ``transformers`` ``DeepseekV4ForCausalLM`` under phaseinterp's hooks and model protocol.

    ``model(tokens)`` returns logits ``[batch, pos, d_vocab]`` equal to the HF forward's;
    ``run_with_hooks`` / ``run_with_cache`` / ``hooks()`` are TransformerLens's. The HF model is
    ``model.hf`` (weights shared, not copied). No incremental cache: every call is a full forward.
    """

    def __init__(self, hf_model: nn.Module, name: Optional[str] = None):
        super().__init__()
        self.hf = hf_model
        self.cfg = DeepseekV4HookedConfig.from_hf(hf_model.config, name=name)
        self.metadata: dict[str, Any] = {}
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList([BlockHooks(layer, i) for i, layer in enumerate(hf_model.model.layers)])
        self.hook_final = HookPoint()
        self.setup()
        self.cfg.device = str(self.device)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self.cfg.device = str(self.device)
        return out

    @property
    def device(self) -> torch.device:
        return self.hf.model.embed_tokens.weight.device

    # ---------------------------------------------------------------- forward
    def _check_tokens(self, tokens: Tensor) -> None:
        if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise TypeError(f"tokens must be an integer tensor [batch, pos], got {getattr(tokens, 'dtype', type(tokens))}")
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape [batch, pos], got {tuple(tokens.shape)}")
        if tokens.shape[1] == 0:
            raise ValueError("tokens has no positions (shape [batch, 0])")
        if tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds n_ctx={self.cfg.n_ctx} (valid: 1..{self.cfg.n_ctx})")
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.cfg.d_vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the vocabulary (valid ids: 0..{self.cfg.d_vocab - 1})")

    def forward(self, tokens: Tensor, *, return_type: Optional[str] = "logits") -> Optional[Tensor]:
        """Logits ``[batch, pos, d_vocab]`` (``"logits"``), the mean next-token loss (``"loss"``) or None."""
        if return_type not in ("logits", "loss", None):
            raise ValueError(f"return_type={return_type!r} is not one of ('logits', 'loss', None)")
        self._check_tokens(tokens)
        from transformers.masking_utils import create_sliding_window_causal_mask

        hf = self.hf.model
        tokens = tokens.to(self.device).long()
        embeds = self.hook_embed(hf.embed_tokens(tokens))
        position_ids = torch.arange(tokens.shape[1], device=embeds.device).unsqueeze(0)
        mask = create_sliding_window_causal_mask(config=hf.config, inputs_embeds=embeds, attention_mask=None,
                                                 cache=None, position_ids=position_ids)
        streams = embeds.unsqueeze(2).expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
        rope = {kind: hf.rotary_emb(embeds, position_ids=position_ids, layer_type=kind) for kind in ("main", "compress")}
        for block in self.blocks:
            device = block.hf.input_layernorm.weight.device  # device_map: a decoder layer lives on one device
            if streams.device != device:
                streams, position_ids = streams.to(device), position_ids.to(device)
                rope = {k: (c.to(device), s.to(device)) for k, (c, s) in rope.items()}
                mask = mask.to(device) if isinstance(mask, Tensor) else mask
                tokens = tokens.to(device)
            streams = block(streams, rope, position_ids, mask, tokens)
        streams = streams.to(hf.norm.weight.device)
        final = self.hook_final(hf.norm(hf.hc_head(streams)))
        if return_type is None:
            return None
        logits = self.hf.lm_head(final.to(self.hf.lm_head.weight.device))
        if return_type == "logits":
            return logits
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten().to(logits.device))

    def run_with_cache(self, *model_args: Any, return_cache_object: bool = True, **kwargs: Any):
        """TransformerLens's ``run_with_cache`` (an ``ActivationCache`` unless ``return_cache_object=False``)."""
        out, cache_dict = super().run_with_cache(*model_args, **kwargs)
        if not return_cache_object:
            return out, cache_dict
        from transformer_lens.ActivationCache import ActivationCache

        return out, ActivationCache(cache_dict, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    # --------------------------------------------------------------- metadata
    def _check_layer(self, layer: int) -> None:
        n = self.cfg.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not (0 <= layer < n):
            raise ValueError(f"layer={layer!r} is out of range for a {n}-layer model (0..{n - 1})")

    def _compressor(self, layer: int) -> CompressorHooks:
        self._check_layer(layer)
        comp = self.blocks[layer].attn.compressor
        if not isinstance(comp, CompressorHooks):
            raise ValueError(f"layer {layer} is a sliding-window-only layer (no compressor); compressed layers: "
                             f"{self.cfg.compressed_layers}")
        return comp

    def kv_head_groups(self) -> dict[int, list[int]]:
        """KV head -> the query heads that read it (one shared KV head: all of them)."""
        return self.cfg.kv_head_groups()

    def o_group_heads(self) -> list[list[int]]:
        """Query heads per output-projection group: pass as ``ablate(model, heads=...)`` for per-group units."""
        return self.cfg.o_group_heads()

    def position_bias(self, layer: int) -> nn.Parameter:
        """The per-slot gate bias of ``layer``'s compressor, HF's own parameter (edits write through):
        ``[S, 2 * d_head]`` for CSA (half 0 = channels ``:d_head``), ``[R, d_head]`` for HCA."""
        return self._compressor(layer).position_bias

    def gate_parameters(self, layer: int, branch: str = "k") -> GateParameters:
        """Per-slot gate parameters ``Z`` ``[slot, 1, d_head, d_model]`` (the ``gate_proj`` rows each slot
        uses) and ``b`` ``[slot, 1, d_head]`` (``position_bias`` laid out per slot, slot = half * S + i).
        Copies: edit `position_bias` to change the model. K = V, so both branches are the same gate."""
        if branch not in ("k", "v"):
            raise ValueError(f"branch={branch!r} is not one of ('k', 'v')")
        comp = self._compressor(layer)
        S, d = comp.compress_rate, self.cfg.d_head
        halves = 2 if comp.two_halves else 1
        Z = einops.rearrange(comp.hf.gate_proj.weight.detach(), "(half d) m -> half d m", half=halves)
        Z = einops.repeat(Z, "half d m -> (half s) 1 d m", s=S)
        b = einops.rearrange(comp.position_bias.detach(), "s (half d) -> (half s) 1 d", half=halves, d=d)
        return GateParameters(Z=Z, b=b, kernel="deepseek", branch=branch)

    def entry_sources(self, layer: int, n_entries: int) -> list[list[int]]:
        """Source positions of each compressed entry of ``layer`` (HF layout; CSA entry 0 is partial)."""
        comp = self._compressor(layer)
        S = comp.compress_rate
        if comp.two_halves:
            return [list(range(max(0, (j - 1) * S), (j + 1) * S)) for j in range(n_entries)]
        return [list(range(j * S, (j + 1) * S)) for j in range(n_entries)]

    def key_slot_sources(self, layer: int, query_pos: int, n_key_slots: Optional[int] = None, *,
                         seq_len: Optional[int] = None) -> list[tuple[str, list[int]]]:
        """``(kind, source positions)`` of every key slot of ``hook_pattern`` for one query.

        HF layout: slots ``0..T-1`` are the tokens (``"local"`` inside the sliding window
        ``query_pos - sliding_window + 1 .. query_pos``, else ``"masked"``), then one slot per
        compressed entry (``"entry"`` once closed, else ``"masked"``; see `entry_sources`).
        Whether the CSA indexer keeps a closed entry depends on the prompt: read
        ``indexer.hook_selected``. ``T`` comes from ``seq_len``, else from ``n_key_slots``
        (``T + T // S`` slots), else ``query_pos + 1``.
        """
        self._check_layer(layer)
        stride = self.cfg.layer_stride(layer)
        if seq_len is None and n_key_slots is not None:
            per = (lambda t: t) if stride is None else (lambda t: t + t // stride)
            seq_len = next((t for t in range(n_key_slots + 1) if per(t) == n_key_slots), None)
            if seq_len is None:
                raise ValueError(f"n_key_slots={n_key_slots} matches no sequence length for layer {layer}")
        T = query_pos + 1 if seq_len is None else seq_len
        if not (0 <= query_pos < T):
            raise ValueError(f"query_pos={query_pos} is out of range 0..{T - 1}")
        lower = query_pos - self.cfg.sliding_window + 1
        out = [("local", [p]) if lower <= p <= query_pos else ("masked", []) for p in range(T)]
        if stride is None:
            return out
        closed = (query_pos + 1) // stride
        for j, sources in enumerate(self.entry_sources(layer, T // stride)):
            out.append(("entry", sources) if j < closed else ("masked", []))
        return out

    def __repr__(self) -> str:
        n_params = sum(p.numel() for p in self.hf.parameters())
        return f"HookedDeepseekV4({self.cfg.label}, layers={self.cfg.n_layers}, params={n_params:,})"

    # ----------------------------------------------------------- checkpoints
    def save_pretrained(self, directory: Union[str, Path], metadata: Optional[dict] = None) -> Path:
        """HF ``save_pretrained`` (safetensors + config.json) plus ``phaseinterp.json`` with ``metadata``."""
        from phaseinterp._files import atomic_write, json_default

        directory = Path(directory)
        self.hf.save_pretrained(directory)
        meta = {**self.metadata, **(metadata or {})}
        atomic_write(directory / SIDECAR_FILE, json.dumps({"metadata": meta}, indent=2, default=json_default).encode())
        return directory
