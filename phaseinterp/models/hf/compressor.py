"""The compressors of `HookedDeepseekV4`: HF's CSA / HCA / Lightning-Indexer compression, hooked.

A re-implementation of HF's stateless compression (``transformers.models.deepseek_v4``) that
calls the HF modules' own parameters, with the ``blocks.{l}.attn.compressor.*`` HookPoints
(layout and hook shapes: `phaseinterp.models.hf.deepseek_v4`).
"""

from __future__ import annotations


import torch
import torch.nn as nn
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from phaseinterp.errors import UserInputError
from phaseinterp.models.hf.chunking import chunk_ranges
from phaseinterp.models.paths import query_context
from phaseinterp.models.hf.config import CSA


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

    # One gate feeds the one K = V entry: an edit of hook_gate_logits / hook_gate moves K and V alike.
    shared_gate = True

    def __init__(self, hf_module: nn.Module, two_halves: bool, kv_head_axis: bool):
        super().__init__()
        object.__setattr__(self, "hf", hf_module)
        self.two_halves = two_halves
        self.kv_head_axis = kv_head_axis  # main compressor: hooks carry the (single) KV-head axis; indexer: none
        self.hook_token_kv = HookPoint()
        self.hook_token_gate_logits = HookPoint()
        self.hook_gate_logits = HookPoint()
        self.hook_gate = HookPoint()
        self.hook_kv_compressed = HookPoint()
        self.hook_normed_kv_compressed = HookPoint()
        self.hook_rot_kv_compressed = HookPoint()

    def gate_hook(self, branch: str, logits: bool = False) -> str:
        """Name (relative to this module) of the alpha / gate-logit hook feeding ``branch``: K = V share one."""
        if branch not in ("k", "v"):
            raise UserInputError(f"branch={branch!r} is not one of ('k', 'v')")
        return "hook_gate_logits" if logits else "hook_gate"

    @property
    def position_bias(self) -> nn.Parameter:
        """HF's per-slot gate bias (the "ape"): ``[S, half * d_head]`` for CSA, ``[R, d_head]`` for HCA."""
        bias = self.hf.position_bias
        if bias.device.type == "meta":
            # accelerate offload: the value lives in the offload map; an edit here would be lost silently
            raise UserInputError("this compressor's position_bias is offloaded by device_map (CPU/disk offload, "
                                "weights on 'meta'): gate edits (shift_gates, gate_parameters) need the layer in "
                                "memory; load with a max_memory / device_map that keeps the compressed layers on a device")
        return bias

    @property
    def compress_rate(self) -> int:
        return int(self.hf.compress_rate)

    def compress(self, x: Tensor, first_window: int = 0) -> Tensor:
        """HF's stateless compression of every closed window of ``x`` ``[batch, pos, d_model]``.

        ``K_j = kv_norm(sum_i alpha_{j,i} * kv_{j,i})``, ``alpha_j = softmax_i(gate_{j,i} + position_bias_i)``
        over the entry's slots, then RoPE at position ``j * S``. Returns ``[batch, entry, d]`` (rotated).
        ``first_window``: the window index of ``x``'s first token (``x`` a slice of a longer sequence
        starting at ``first_window * S``; its entries are rotated at their positions in that sequence).
        """
        hf = self.hf
        mod = _hf()
        batch, T, _ = x.shape
        d = hf.head_dim
        halves = 2 if self.two_halves else 1
        S = self.compress_rate
        kv = self.hook_token_kv(hf.kv_proj(x).view(batch, T, halves, d)).reshape(batch, T, halves * d)
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
        new_gate = self._unsqueezed(self.hook_gate_logits, new_gate)
        alpha = new_gate.softmax(dim=2, dtype=torch.float32).to(new_kv.dtype)
        alpha = self._unsqueezed(self.hook_gate, alpha)
        compressed = self._unsqueezed(self.hook_kv_compressed, (new_kv * alpha).sum(dim=2))
        compressed = self._unsqueezed(self.hook_normed_kv_compressed, hf.kv_norm(compressed))
        positions = ((torch.arange(n_windows, device=compressed.device) + first_window) * S).unsqueeze(0).expand(batch, -1)
        cos, sin = hf.rotary_emb(compressed, position_ids=positions, layer_type=hf.rope_layer_type)
        compressed = mod.apply_rotary_pos_emb(compressed.unsqueeze(1), cos, sin).squeeze(1)
        return self._unsqueezed(self.hook_rot_kv_compressed, compressed)

    def _unsqueezed(self, hook, t: Tensor) -> Tensor:
        # Main-compressor hooks carry the (single) KV-head axis; the indexer has none.
        if not self.kv_head_axis:
            return hook(t)
        axis = 2 if t.ndim == 3 else 3
        return hook(t.unsqueeze(axis)).squeeze(axis)


class IndexerHooks(_CompressionHooks):
    """The Lightning Indexer: its own compressor, query heads, scores and top-k selection."""

    def __init__(self, hf_indexer: nn.Module):
        super().__init__(hf_indexer, two_halves=True, kv_head_axis=False)
        self.hook_q = HookPoint()
        self.hook_scores = HookPoint()
        self.hook_selected = HookPoint()

    def select(self, x: Tensor, q_residual: Tensor, position_ids: Tensor, query_chunk="auto") -> Tensor:
        """`forward`'s top-``index_topk`` selection ``[batch, pos, k]`` (-1 where fewer are closed), with the
        scores computed per query chunk (``[batch, chunk, entry]``, never ``[batch, pos, entry]``).

        ``hook_q`` and ``hook_selected`` fire once with their full shapes; ``hook_scores`` (``[pos,
        entry]`` by nature) fires once per chunk with ``ctx["query_range"]``. Each chunk's score rows
        have every entry of the prompt as columns (later ones -inf), as in transformers' one call, and
        ``torch.topk`` is called on them: a row's selection does not depend on how many rows share the
        call (checked on CPU with exact ties, tests/test_dsv4_long.py), so ties break as transformers
        breaks them."""
        hf = self.hf
        mod = _hf()
        batch, T, _ = x.shape
        compressed = self.compress(x)  # [batch, entry, d_index]
        n_entries = compressed.shape[1]
        cos_q, sin_q = hf.rotary_emb(x, position_ids=position_ids, layer_type=hf.rope_layer_type)
        q = hf.q_b_proj(q_residual).view(batch, T, -1, hf.head_dim).transpose(1, 2)
        q = self.hook_q(mod.apply_rotary_pos_emb(q, cos_q, sin_q).transpose(1, 2))  # [batch, pos, head, d]
        top_k = min(self.hf.index_topk, n_entries)
        selected = torch.empty((batch, T, top_k), dtype=torch.long, device=x.device)  # every row set below
        entry = torch.arange(n_entries, device=x.device)
        per_query = max(1, n_entries) * (q.shape[2] + 2)  # one prompt row: the chunks never depend on the batch
        for a, b in chunk_ranges(T, per_query, query_chunk):
            threshold = (position_ids[:, a:b] + 1) // hf.compress_rate
            # every entry of the prompt is a column (transformers' layout: torch.topk breaks the many ties
            # of ReLU's zeros by column, so the columns must be the same); only those closed by the chunk's
            # last query are scored, the rest are -inf in every row of the chunk anyway
            n = min(n_entries, int(threshold.max()))
            scores = compressed.new_empty((batch, b - a, n_entries), dtype=torch.float32)
            scores[..., n:] = float("-inf")
            scores[..., :n] = index_scores(hf.scorer, q[:, a:b], compressed[:, :n], x[:, a:b])
            scores[..., :n].masked_fill_(entry[:n].view(1, 1, -1) >= threshold.unsqueeze(-1), float("-inf"))
            with query_context((self.hook_scores,), a, b):
                scores = self.hook_scores(scores)
            if top_k:
                top = scores.topk(top_k, dim=-1).indices
                selected[:, a:b] = torch.where(top >= threshold.unsqueeze(-1), torch.full_like(top, -1), top)
        return self.hook_selected(selected)

    def scores(self, x: Tensor, q_residual: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """(``hook_scores``: every query's score of every entry ``[batch, pos, entry]``, -inf on entries
        not closed yet; the indexer's entries ``[batch, entry, d_index]``)."""
        hf = self.hf
        mod = _hf()
        batch, T, _ = x.shape
        compressed = self.compress(x)  # [batch, entry, d_index]
        cos_q, sin_q = hf.rotary_emb(x, position_ids=position_ids, layer_type=hf.rope_layer_type)
        q = hf.q_b_proj(q_residual).view(batch, T, -1, hf.head_dim).transpose(1, 2)
        q = self.hook_q(mod.apply_rotary_pos_emb(q, cos_q, sin_q).transpose(1, 2))
        scores = hf.scorer(q, compressed, x)  # [batch, pos, entry]
        n_entries = compressed.shape[1]
        if n_entries == 0:
            return self.hook_scores(scores), compressed
        threshold = (position_ids + 1) // hf.compress_rate  # entries j < threshold are closed
        entry = torch.arange(n_entries, device=scores.device)
        scores = scores.masked_fill(entry.view(1, 1, -1) >= threshold.unsqueeze(-1), float("-inf"))
        return self.hook_scores(scores), compressed


def index_scores(scorer: nn.Module, q: Tensor, entries: Tensor, x: Tensor) -> Tensor:
    """transformers' ``DeepseekV4IndexerScorer.forward`` (``sum_h w_{t,h} relu(q_{t,h} . K_s)``), op for op,
    so bit for bit the same scores; without autograd its elementwise steps run in place (no new
    ``[batch, C, head, entry]`` block per step). ``q`` ``[batch, C, head, d]``, ``entries`` ``[batch, E, d]``,
    ``x`` ``[batch, C, d_model]``; returns ``[batch, C, E]``."""
    if torch.is_grad_enabled():
        return scorer(q, entries, x)
    scores = torch.matmul(q.float(), entries.transpose(-1, -2).float().unsqueeze(1))  # [batch, C, head, E]
    scores.relu_().mul_(scorer.softmax_scale)
    weights = scorer.weights_proj(x).float() * scorer.weights_scaling  # [batch, C, head]
    return scores.mul_(weights.unsqueeze(-1)).sum(dim=2)


class CompressorHooks(_CompressionHooks):
    """A CSA (two halves + indexer) or HCA (one half) compressor: `compress` gives the entries; a CSA
    layer's `IndexerHooks.select` which of them each query sees."""

    def __init__(self, hf_compressor: nn.Module, kind: str):
        super().__init__(hf_compressor, two_halves=kind == CSA, kv_head_axis=True)
        self.kind = kind
        self.indexer = IndexerHooks(hf_compressor.indexer) if kind == CSA else None


class _NoCompressor(nn.Module):
    """Stand-in on sliding-window-only layers: asking for its gates is an error that says why."""

    def __init__(self, layer: int):
        super().__init__()
        self.layer = layer

    @property
    def position_bias(self):
        raise UserInputError(f"layer {self.layer} is a sliding-window-only layer: it has no compressor or gates "
                            "(pass layers=model.cfg.compressed_layers)")
