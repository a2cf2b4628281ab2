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

from typing import Optional

from phaseinterp.errors import UserInputError
from phaseinterp.models.hf.cache import CompressionState
from phaseinterp.models.hf.chunking import chunk_ranges
from phaseinterp.models.hf.config import CSA
from phaseinterp.models.paths import has_hooks, query_context


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

    def extend(self, x: Tensor, start: int, state: Optional[CompressionState]) -> tuple[Tensor, CompressionState]:
        """HF's stateless compression, continued: ``x`` ``[batch, n, d_model]`` the tokens at positions
        ``start .. start + n - 1`` after ``state`` (None: ``start`` is 0). Returns every entry closed by
        ``start + n`` ``[batch, entry, d]`` (rotated) and the state a later call continues from.

        ``K_j = kv_norm(sum_i alpha_{j,i} * kv_{j,i})``, ``alpha_j = softmax_i(gate_{j,i} + position_bias_i)``
        over the entry's slots, then RoPE at position ``j * S``. The per-token hooks (``hook_token_kv``,
        ``hook_token_gate_logits``) fire on the ``n`` new tokens; the per-entry hooks on the entries this
        call closes, ``hook.ctx["entry_range"] == (j0, j1)``, and not at all when it closes none.
        """
        hf = self.hf
        batch, n, _ = x.shape
        d = hf.head_dim
        halves = 2 if self.two_halves else 1
        S = self.compress_rate
        kv = self.hook_token_kv(hf.kv_proj(x).view(batch, n, halves, d)).reshape(batch, n, halves * d)
        gate = self.hook_token_gate_logits(hf.gate_proj(x).view(batch, n, halves, d)).reshape(batch, n, halves * d)
        if state is None:
            if start:
                raise RuntimeError(f"internal: a compressor state is needed at position {start}")
            entries, first = kv.new_zeros((batch, 0, d)), 0
        else:
            kv, gate = torch.cat([state.kv, kv], dim=1), torch.cat([state.gate, gate], dim=1)
            entries, first = state.entries, state.first
        j0, j1 = start // S, (start + n) // S  # windows closed before and after this call
        if j1 > j0:
            entries = torch.cat([entries, self._pool(kv, gate, first // S, j0, j1)], dim=1)
        # what a later entry still reads: the open window (CSA: and the last closed one, its older half)
        keep = max(0, j1 - (1 if self.two_halves else 0)) * S
        # copies of the few kept rows: the call's per-token tensors are freed with it
        return entries, CompressionState(entries, kv[:, keep - first:].clone(), gate[:, keep - first:].clone(), keep)

    def _pool(self, kv: Tensor, gate: Tensor, w0: int, j0: int, j1: int) -> Tensor:
        """Entries ``j0 .. j1 - 1`` ``[batch, j1 - j0, d]`` (rotated) from the per-token projections ``kv``,
        ``gate`` whose index 0 is window ``w0``'s first token (``w0 <= j0``; a CSA entry ``j0 > w0`` reads
        its older half from window ``j0 - 1``, which they hold)."""
        hf = self.hf
        mod = _hf()
        batch = kv.shape[0]
        d = hf.head_dim
        S = self.compress_rate
        n_windows = j1 - w0
        chunk_kv = kv[:, :n_windows * S].view(batch, n_windows, S, -1)
        chunk_gate = gate[:, :n_windows * S].view(batch, n_windows, S, -1) + hf.position_bias
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
        new_kv, new_gate = new_kv[:, j0 - w0:], new_gate[:, j0 - w0:]
        with query_context(self._entry_points(), j0, j1, key="entry_range"):
            new_gate = self._unsqueezed(self.hook_gate_logits, new_gate)
            alpha = new_gate.softmax(dim=2, dtype=torch.float32).to(new_kv.dtype)
            alpha = self._unsqueezed(self.hook_gate, alpha)
            compressed = self._unsqueezed(self.hook_kv_compressed, (new_kv * alpha).sum(dim=2))
            compressed = self._unsqueezed(self.hook_normed_kv_compressed, hf.kv_norm(compressed))
            positions = (torch.arange(j0, j1, device=compressed.device) * S).unsqueeze(0).expand(batch, -1)
            cos, sin = hf.rotary_emb(compressed, position_ids=positions, layer_type=hf.rope_layer_type)
            compressed = mod.apply_rotary_pos_emb(compressed.unsqueeze(1), cos, sin).squeeze(1)
            return self._unsqueezed(self.hook_rot_kv_compressed, compressed)

    def _entry_points(self) -> list:
        return [p for p in (self.hook_gate_logits, self.hook_gate, self.hook_kv_compressed,
                            self.hook_normed_kv_compressed, self.hook_rot_kv_compressed) if has_hooks(p)]

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

    def select(self, x: Tensor, q_residual: Tensor, position_ids: Tensor, entries: Tensor,
               query_chunk="auto") -> Tensor:
        """The top-``index_topk`` entries of each query ``[batch, n, k]`` (-1 where fewer are closed; ``k =
        min(index_topk, entry)``), ascending: ``x``, ``q_residual`` the queries' attention input and query
        residual ``[batch, n, .]`` at positions ``position_ids`` ``[1, n]``; ``entries`` the indexer's
        entries closed by the last of them (`extend`).

        ``hook_q`` and ``hook_selected`` fire once per call; ``hook_scores`` (``[chunk, entry]``, every
        entry a column, those not closed yet at a query -inf) once per query chunk with
        ``ctx["query_range"]``. The choice is a function of each row's scores alone (`top_k_set`): exact
        ties at the ``k``-th score go to the lowest entry indices, so a query selects the same entries
        in a full forward, a chunked one and a decoding step (transformers' ``torch.topk`` does not)."""
        hf = self.hf
        mod = _hf()
        batch, n, _ = x.shape
        n_entries = entries.shape[1]
        cos_q, sin_q = hf.rotary_emb(x, position_ids=position_ids, layer_type=hf.rope_layer_type)
        q = hf.q_b_proj(q_residual).view(batch, n, -1, hf.head_dim).transpose(1, 2)
        q = self.hook_q(mod.apply_rotary_pos_emb(q, cos_q, sin_q).transpose(1, 2))  # [batch, n, head, d]
        top_k = min(self.hf.index_topk, n_entries)
        selected = torch.empty((batch, n, top_k), dtype=torch.long, device=x.device)  # every row set below
        entry = torch.arange(n_entries, device=x.device)
        # without a hook on hook_scores, a chunk's scores are laid out over its closed entries only: the
        # columns no query of the chunk sees yet would be -inf and add nothing to the choice (top_k_set is a
        # function of the row's values: -inf columns past the closed ones are never chosen over a finite one,
        # and where fewer than k are finite the choice reaches them only to drop them as -1 below)
        hooked = has_hooks(self.hook_scores)
        start = int(position_ids[0, 0])
        per_query = max(1, n_entries) * (q.shape[2] + 2)  # one prompt row: the chunks never depend on the batch
        for a, b in chunk_ranges(n, per_query, query_chunk):
            threshold = (position_ids[:, a:b] + 1) // hf.compress_rate  # entries j < threshold are closed
            n_closed = min(n_entries, int(threshold.max()))  # only those are scored; the rest are -inf
            if not top_k:
                if hooked:
                    with query_context((self.hook_scores,), start + a, start + b):
                        self.hook_scores(entries.new_empty((batch, b - a, n_entries), dtype=torch.float32))
                continue
            if not hooked and n_closed <= top_k:  # every entry closed by the chunk's end is chosen
                top = entry[:top_k].expand(batch, b - a, -1)
                selected[:, a:b] = torch.where(top >= threshold.unsqueeze(-1), -1, top)
                continue
            scores = index_scores(hf.scorer, q[:, a:b], entries[:, :n_closed], x[:, a:b])
            if hooked:  # every entry a column (docs/hooks.md)
                full = scores.new_empty((batch, b - a, n_entries))
                full[..., n_closed:] = float("-inf")
                full[..., :n_closed] = scores
                scores = full
            low = min(n_closed, int(threshold.min()))  # entries before `low` are closed at every query of the chunk
            if low < n_closed:
                scores[..., low:n_closed].masked_fill_(entry[low:n_closed].view(1, 1, -1) >= threshold.unsqueeze(-1),
                                                       float("-inf"))
            if hooked:
                with query_context((self.hook_scores,), start + a, start + b):
                    scores = self.hook_scores(scores)
            top = top_k_set(scores, top_k)
            selected[:, a:b] = torch.where(top >= threshold.unsqueeze(-1), -1, top)
        return self.hook_selected(selected)


def top_k_set(scores: Tensor, k: int) -> Tensor:
    """The ``k`` highest scores of each row ``[..., k]``, as entry indices in ascending order; exact ties at
    the ``k``-th score go to the lowest indices (ties at -inf too: a row with fewer than ``k`` finite
    scores takes its -inf entries lowest first). A function of the row's values alone (not of its length
    or the rows beside it): ``torch.topk`` itself breaks ties by an implementation-defined rule that
    depends on the row's length, so only its values are read here.

    One unsorted ``topk`` gives each row's ``k``-th value ``v``; a row where exactly ``k`` scores are ``>=
    v`` (no tie across the ``k``-th place) keeps those; a row with more (ties at ``v``, e.g. the indexer's
    ReLU zeros) keeps those above ``v`` and its lowest tied entries up to ``k``. The kept entries of every
    row, in order, are the ascending indices (one ``nonzero``, no sort). Rows whose ``v`` is NaN (a hook's
    edit) fall back to ``topk``'s own choice, sorted."""
    shape, n = scores.shape[:-1], scores.shape[-1]
    if k >= n:
        return torch.arange(n, device=scores.device)[:k].expand(*shape, -1).contiguous()
    if k == 0:
        return torch.empty((*shape, 0), dtype=torch.long, device=scores.device)
    kth = scores.topk(k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    keep = scores >= kth
    count = keep.sum(-1)
    crossing = count > k
    if crossing.any():
        rows, kth_rows = scores[crossing], kth[crossing]
        above = rows > kth_rows
        room = k - above.sum(-1, keepdim=True)
        tied = rows == kth_rows
        keep[crossing] = above | (tied & (tied.to(torch.int32).cumsum(-1, dtype=torch.int32) <= room))
    short = count < k  # NaN at the k-th place: no score compares >= it
    if not short.any():
        return _kept_indices(keep, k)
    top = scores.new_empty((*shape, k), dtype=torch.long)
    whole = ~short
    top[whole] = _kept_indices(keep[whole], k)
    top[short] = scores[short].topk(k, dim=-1).indices.sort(dim=-1).values
    return top


def _kept_indices(keep: Tensor, k: int) -> Tensor:
    """The column indices of ``keep``'s True entries, ``k`` in each row ``[..., k]``, ascending: one flat
    ``nonzero`` (``[rows * k]`` int64, not ``[rows * k, ndim]``), then each index's column."""
    return keep.reshape(-1).nonzero().view(*keep.shape[:-1], k).remainder_(keep.shape[-1])


def index_scores(scorer: nn.Module, q: Tensor, entries: Tensor, x: Tensor) -> Tensor:
    """transformers' ``DeepseekV4IndexerScorer.forward`` (``sum_h w_{t,h} relu(q_{t,h} . K_s)``), op for op
    but the score matmul's batching, bit for bit the same scores; without autograd its elementwise steps
    run in place. ``q`` ``[batch, C, head, d]``, ``entries`` ``[batch, E, d]``, ``x`` ``[batch, C,
    d_model]``; returns ``[batch, C, E]``."""
    if torch.is_grad_enabled():
        return scorer(q, entries, x)
    batch, C, H, d = q.shape
    # one [C * head, d] x [d, E] product per prompt row (the same dot products as transformers' C batches)
    scores = torch.matmul(q.float().reshape(batch, C * H, d), entries.transpose(-1, -2).float())
    scores = scores.view(batch, C, H, -1)  # [batch, C, head, E]
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
