"""Grouped-query attention over exact local tokens plus compressed window entries.

Each query ``t`` runs ONE softmax over (SCIENCE.md section 2):

(a) exact K/V of a band of recent tokens -- the last ``L = local_window`` tokens
    (``memory="local"``, the query included), or only the tokens not yet covered by a
    closed window (``memory="uncompressed_tail"``);
(b) every compressed entry ``j`` whose window has closed: ``j*S + W - 1 <= t``.

Key-slot layout of ``hook_attn_scores`` / ``hook_pattern`` ``[batch, head, query_pos, key_slot]``:
slots ``0 .. B-1`` are the band, oldest first (slot ``s`` of query ``t`` holds source
position ``t - B + 1 + s``; slot ``B-1`` is the query itself), then slot ``B + j`` is
compressed entry ``j``. ``B = band_width`` is ``L`` for local memory and
``max(W, S) - 1`` (at least 1) for the uncompressed tail. Invalid slots (before the
sequence start, outside the tail, entries not yet closed) hold ``-inf`` scores and zero
probability. `CompressedAttention.key_slot_sources` maps slots back to positions. The
full-attention baseline uses plain positions as key slots.

Positions: queries and band keys are rotated at their own position; compressed keys at
``j*S + W - S`` (DeepSeek-V4's convention: the first token of the window's newest
S-block; equals ``j`` when W = S = 1). QK-norm, when on, normalises queries, band keys
and compressed keys alike. Values are never rotated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import einops
import torch
import torch.nn as nn
from jaxtyping import Float
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from phaseinterp.config import CompressedConfig
from phaseinterp.models.compressor import Compressor, RMSNorm, rms_norm
from phaseinterp.phase import n_visible_entries, tail_start


@dataclass
class LayerCache:
    """Everything one layer needs to extend a prefix: per-token inputs and closed entries."""

    h: Tensor  # [batch, pos, d_model]  attention input (after ln1): the compressor reads it
    k: Tensor  # [batch, pos, kv_head, d_head]  per-token K projection (hook_k)
    v: Tensor  # [batch, pos, kv_head, d_head]
    k_rot: Tensor  # [batch, pos, kv_head, d_head]  after QK-norm and RoPE
    k_comp: Tensor  # [batch, entry, kv_head, d_head]  normalised + rotated compressed keys
    v_comp: Tensor  # [batch, entry, kv_head, d_head]

    def map(self, fn) -> "LayerCache":
        return LayerCache(*(fn(t) for t in (self.h, self.k, self.v, self.k_rot, self.k_comp, self.v_comp)))


@dataclass
class KVCache:
    """Incremental-decoding state of a `CompressedTransformer` (compressor state included).

    Feeding a sequence in pieces through ``model(tokens, cache=cache)`` gives the same
    outputs as one full forward. ``length`` is the number of tokens consumed so far.
    """

    layers: list[Optional[LayerCache]] = field(default_factory=list)
    length: int = 0

    def clone(self) -> "KVCache":
        return KVCache([lc.map(lambda t: t.clone()) if lc else None for lc in self.layers], self.length)

    def repeat_batch(self, n: int) -> "KVCache":
        """Each batch row repeated ``n`` times, interleaved (row b -> rows b*n .. b*n+n-1)."""
        return KVCache(
            [lc.map(lambda t: t.repeat_interleave(n, dim=0)) if lc else None for lc in self.layers], self.length
        )

    @property
    def batch_size(self) -> int:
        first = next((lc for lc in self.layers if lc is not None), None)
        return 0 if first is None else first.h.shape[0]


def rotary_tables(cfg: CompressedConfig, device=None) -> tuple[Tensor, Tensor]:
    """cos/sin ``[n_ctx, rotary_dims / 2]`` for rotate-half RoPE on the first ``rotary_dims`` dims."""
    r = max(cfg.rotary_dims, 2)
    inv_freq = cfg.rope_base ** (-torch.arange(0, r, 2, dtype=torch.float64, device=device) / r)
    angles = torch.arange(cfg.n_ctx, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(
    x: Float[Tensor, "batch pos head d_head"], cos: Float[Tensor, "pos half"], sin: Float[Tensor, "pos half"], dims: int
) -> Float[Tensor, "batch pos head d_head"]:
    if dims == 0:
        return x
    half = dims // 2
    x1, x2, rest = x[..., :half], x[..., half:dims], x[..., dims:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


class CompressedAttention(nn.Module):
    """GQA attention whose long-range memory is the compressed cache (or full attention)."""

    def __init__(self, cfg: CompressedConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        H, KV, dh, dm = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
        self.W_Q = nn.Parameter(torch.zeros(H, dm, dh))
        self.W_K = nn.Parameter(torch.zeros(KV, dm, dh))
        self.W_V = nn.Parameter(torch.zeros(KV, dm, dh))
        self.W_O = nn.Parameter(torch.zeros(H, dh, dm))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(dh, cfg.norm_eps)
            self.k_norm = RMSNorm(dh, cfg.norm_eps)
        self.compressor = Compressor(cfg) if cfg.is_compressed else None
        cos, sin = rotary_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, kv_head, d_head]
        self.hook_v = HookPoint()
        self.hook_rot_q = HookPoint()  # after QK-norm + RoPE
        self.hook_rot_k = HookPoint()
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_slot]
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model], only if cfg.use_attn_result

    # ----------------------------------------------------------------- layout
    @property
    def band_width(self) -> int:
        cfg = self.cfg
        if not cfg.is_compressed:
            return 0
        if cfg.memory == "local":
            return cfg.local_window
        return max(cfg.window - 1, cfg.stride - 1, 1)

    def key_slot_sources(self, query_pos: int, n_key_slots: Optional[int] = None) -> list[tuple[str, list[int]]]:
        """For a query at ``query_pos``: ``(kind, source positions)`` for every key slot.

        ``kind`` is ``"local"``, ``"entry"`` or ``"masked"`` (``"token"`` for full
        attention). Entries list the W positions of their window.
        """
        cfg = self.cfg
        if query_pos < 0 or query_pos >= cfg.n_ctx:
            raise ValueError(f"query_pos={query_pos} is out of range 0..{cfg.n_ctx - 1}")
        if not cfg.is_compressed:
            n = n_key_slots if n_key_slots is not None else query_pos + 1
            return [("token", [p]) if p <= query_pos else ("masked", []) for p in range(n)]
        B = self.band_width
        lower = query_pos - B + 1 if cfg.memory == "local" else tail_start(query_pos, cfg.window, cfg.stride)
        out: list[tuple[str, list[int]]] = []
        for s in range(B):
            p = query_pos - B + 1 + s
            out.append(("local", [p]) if p >= max(lower, 0) else ("masked", []))
        n_entries = n_visible_entries(query_pos, cfg.window, cfg.stride)
        total = n_key_slots - B if n_key_slots is not None else n_entries
        for j in range(total):
            if j < n_entries:
                out.append(("entry", list(range(j * cfg.stride, j * cfg.stride + cfg.window))))
            else:
                out.append(("masked", []))
        return out

    # ---------------------------------------------------------------- forward
    def _rope(self, x: Tensor, positions: Tensor) -> Tensor:
        return apply_rope(x, self.rope_cos[positions], self.rope_sin[positions], self.cfg.rotary_dims)

    def _new_entries(self, cache: LayerCache, n_before: int, n_after: int) -> tuple[Tensor, Tensor]:
        """Compress windows ``n_before .. n_after-1`` from the cached per-token inputs."""
        cfg = self.cfg
        W, S = cfg.window, cfg.stride
        device = cache.h.device
        j = torch.arange(n_before, n_after, device=device)
        idx = j[:, None] * S + torch.arange(W, device=device)[None, :]  # [win, slot]
        k_hat, v_hat = self.compressor(cache.h[:, idx], cache.k[:, idx], cache.v[:, idx])
        return self._finish_entries(k_hat, v_hat, j)

    def _finish_entries(self, k_hat: Tensor, v_hat: Tensor, j: Tensor) -> tuple[Tensor, Tensor]:
        """Normalise compressed entries (DeepSeek's kv_norm, or QK-norm on keys) and rotate the
        keys of windows ``j`` at position ``j*S + W - S``."""
        cfg = self.cfg
        if cfg.compression == "deepseek":
            k_hat = rms_norm(k_hat, self.compressor.kv_norm_weight, cfg.norm_eps)
            v_hat = rms_norm(v_hat, self.compressor.kv_norm_weight, cfg.norm_eps)
        elif cfg.qk_norm:
            k_hat = self.k_norm.unhooked(k_hat)
        return self._rope(k_hat, j * cfg.stride + cfg.window - cfg.stride), v_hat

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        cache: Optional[LayerCache] = None,
        start: int = 0,
    ) -> tuple[Float[Tensor, "batch pos d_model"], LayerCache]:
        """Attention for the ``pos`` new tokens at positions ``start ..``, given the cached prefix."""
        cfg = self.cfg
        batch, n, _ = x.shape
        positions = torch.arange(start, start + n, device=x.device)
        q = self.hook_q(einops.einsum(x, self.W_Q, "b t m, h m d -> b t h d"))
        k = self.hook_k(einops.einsum(x, self.W_K, "b t m, k m d -> b t k d"))
        v = self.hook_v(einops.einsum(x, self.W_V, "b t m, k m d -> b t k d"))
        if cfg.qk_norm:
            q, k_normed = self.q_norm(q), self.k_norm(k)
        else:
            k_normed = k
        q_rot = self.hook_rot_q(self._rope(q, positions))
        k_rot = self.hook_rot_k(self._rope(k_normed, positions))

        if cache is None:
            empty_entries = x.new_zeros(batch, 0, cfg.n_kv_heads, cfg.d_head)
            cache = LayerCache(x, k, v, k_rot, empty_entries, empty_entries.clone())
        else:
            cache = LayerCache(
                torch.cat([cache.h, x], 1),
                torch.cat([cache.k, k], 1),
                torch.cat([cache.v, v], 1),
                torch.cat([cache.k_rot, k_rot], 1),
                cache.k_comp,
                cache.v_comp,
            )
        total = start + n
        q_grouped = einops.rearrange(q_rot, "b t (k g) d -> b t k g d", k=cfg.n_kv_heads)
        scale = cfg.d_head**-0.5

        if not cfg.is_compressed:
            scores = einops.einsum(q_grouped, cache.k_rot, "b t k g d, b p k d -> b k g t p") * scale
            scores = einops.rearrange(scores, "b k g t p -> b (k g) t p")
            allowed = torch.arange(total, device=x.device)[None, :] <= positions[:, None]
            scores = self.hook_attn_scores(scores.masked_fill(~allowed, float("-inf")))
            pattern = self.hook_pattern(scores.softmax(dim=-1))
            pattern_grouped = einops.rearrange(pattern, "b (k g) t p -> b k g t p", k=cfg.n_kv_heads)
            z = einops.einsum(pattern_grouped, cache.v, "b k g t p, b p k d -> b t k g d")
        else:
            W, S = cfg.window, cfg.stride
            n_before = cache.k_comp.shape[1]
            n_after = (total - W) // S + 1 if total >= W else 0
            if n_after > n_before:
                k_new, v_new = self._new_entries(cache, n_before, n_after)
                cache.k_comp = torch.cat([cache.k_comp, k_new], 1)
                cache.v_comp = torch.cat([cache.v_comp, v_new], 1)
            # (a) the band of exact tokens
            B = self.band_width
            band_pos = positions[:, None] - B + 1 + torch.arange(B, device=x.device)[None, :]  # [t, slot]
            n_visible = torch.where(positions + 1 >= W, (positions + 1 - W) // S + 1, torch.zeros_like(positions))
            if cfg.memory == "local":
                lower = torch.zeros_like(positions)
            else:
                lower = torch.where(n_visible > 0, (n_visible - 1) * S + W, torch.zeros_like(positions))
            band_ok = (band_pos >= 0) & (band_pos >= lower[:, None])
            band_idx = band_pos.clamp(min=0)
            k_band = cache.k_rot[:, band_idx]  # [b, t, slot, k, d]
            v_band = cache.v[:, band_idx]
            s_band = einops.einsum(q_grouped, k_band, "b t k g d, b t s k d -> b k g t s")
            # (b) compressed entries whose window has closed
            s_comp = einops.einsum(q_grouped, cache.k_comp, "b t k g d, b j k d -> b k g t j")
            entry_ok = torch.arange(cache.k_comp.shape[1], device=x.device)[None, :] < n_visible[:, None]
            allowed = torch.cat([band_ok, entry_ok], dim=1)  # [t, slot]
            scores = torch.cat([s_band, s_comp], dim=-1) * scale
            scores = einops.rearrange(scores, "b k g t s -> b (k g) t s")
            scores = self.hook_attn_scores(scores.masked_fill(~allowed, float("-inf")))
            pattern = self.hook_pattern(scores.softmax(dim=-1))
            pattern_grouped = einops.rearrange(pattern, "b (k g) t s -> b k g t s", k=cfg.n_kv_heads)
            z = einops.einsum(pattern_grouped[..., :B], v_band, "b k g t s, b t s k d -> b t k g d")
            z = z + einops.einsum(pattern_grouped[..., B:], cache.v_comp, "b k g t j, b j k d -> b t k g d")

        z = self.hook_z(einops.rearrange(z, "b t k g d -> b t (k g) d"))
        if cfg.use_attn_result:
            result = self.hook_result(einops.einsum(z, self.W_O, "b t h d, h d m -> b t h m"))
            out = result.sum(dim=2)
        else:
            out = einops.einsum(z, self.W_O, "b t h d, h d m -> b t m")
        return out, cache

    def forward_last(
        self,
        x: Float[Tensor, "batch variant d_model"],
        cache: LayerCache,
        z_override: Optional[tuple[Tensor, Tensor]] = None,
    ) -> Float[Tensor, "batch variant d_model"]:
        """Attention of ONE new token (position ``cache`` length) in several variants at once.

        The fast path of mean ablation: every variant of the last token attends to the same
        shared prefix ``cache`` (batch ``batch``, never copied); only the variants' own
        K/V (and an entry the token closes) differ. ``z_override = (mask [variant, head],
        z [head, d_head])`` replaces the chosen heads' z before the output projection.
        Hook points other than the compressor's do not fire here; use `forward` for
        hooked runs. Equals `forward` on the extended sequence (tested to 1e-5).
        """
        cfg = self.cfg
        batch, n_var, _ = x.shape
        pos = cache.h.shape[1]
        where = torch.tensor([pos], device=x.device)
        q = einops.einsum(x, self.W_Q, "b v m, h m d -> b v h d")
        k = einops.einsum(x, self.W_K, "b v m, k m d -> b v k d")
        v = einops.einsum(x, self.W_V, "b v m, k m d -> b v k d")
        if cfg.qk_norm:
            q, k_normed = self.q_norm.unhooked(q), self.k_norm.unhooked(k)
        else:
            k_normed = k
        q_rot = self._rope(q, where.expand(n_var))
        k_rot = self._rope(k_normed, where.expand(n_var))
        qg = einops.rearrange(q_rot, "b v (k g) d -> b v k g d", k=cfg.n_kv_heads)
        scale = cfg.d_head**-0.5
        if not cfg.is_compressed:
            prefix_keys, prefix_values = cache.k_rot, cache.v
            entry_scores, entry_values = None, None
        else:
            W, S = cfg.window, cfg.stride
            B = self.band_width
            n_visible = (pos + 1 - W) // S + 1 if pos + 1 >= W else 0
            lower = pos - B + 1
            if cfg.memory == "uncompressed_tail":
                lower = max(lower, (n_visible - 1) * S + W if n_visible > 0 else 0)
            lo = max(lower, 0)
            prefix_keys, prefix_values = cache.k_rot[:, lo:pos], cache.v[:, lo:pos]
            # Entries: those closed by the prefix, plus the one this token closes (if any).
            entry_k = cache.k_comp.unsqueeze(1).expand(-1, n_var, -1, -1, -1)
            entry_v = cache.v_comp.unsqueeze(1).expand(-1, n_var, -1, -1, -1)
            if n_visible > cache.k_comp.shape[1]:
                j = n_visible - 1
                idx = torch.arange(j * S, pos, device=x.device)
                h_win = torch.cat([cache.h[:, idx].unsqueeze(1).expand(-1, n_var, -1, -1), x.unsqueeze(2)], 2)
                k_win = torch.cat([cache.k[:, idx].unsqueeze(1).expand(-1, n_var, -1, -1, -1), k.unsqueeze(2)], 2)
                v_win = torch.cat([cache.v[:, idx].unsqueeze(1).expand(-1, n_var, -1, -1, -1), v.unsqueeze(2)], 2)
                flat = lambda t: einops.rearrange(t, "b v ... -> (b v) 1 ...")  # noqa: E731
                k_hat, v_hat = self.compressor(flat(h_win), flat(k_win), flat(v_win))
                k_hat, v_hat = self._finish_entries(k_hat, v_hat, torch.tensor([j], device=x.device))
                unflat = lambda t: einops.rearrange(t, "(b v) 1 k d -> b v 1 k d", b=batch)  # noqa: E731
                entry_k = torch.cat([entry_k, unflat(k_hat)], 2)
                entry_v = torch.cat([entry_v, unflat(v_hat)], 2)
            entry_scores = einops.einsum(qg, entry_k, "b v k g d, b v j k d -> b v k g j") * scale
            entry_values = entry_v
        s_prefix = einops.einsum(qg, prefix_keys, "b v k g d, b p k d -> b v k g p") * scale
        s_own = einops.einsum(qg, k_rot, "b v k g d, b v k d -> b v k g")[..., None] * scale
        own_ok = True
        if cfg.is_compressed and cfg.memory == "uncompressed_tail" and lower > pos:
            own_ok = False  # the token's own window just closed: it is read through its entry
        parts = [s_prefix] + ([s_own] if own_ok else []) + ([entry_scores] if entry_scores is not None else [])
        pattern = torch.cat(parts, -1).softmax(-1)
        n_prefix = s_prefix.shape[-1]
        z = einops.einsum(pattern[..., :n_prefix], prefix_values, "b v k g p, b p k d -> b v k g d")
        offset = n_prefix
        if own_ok:
            z = z + pattern[..., offset : offset + 1] * v.unsqueeze(3)
            offset += 1
        if entry_scores is not None:
            z = z + einops.einsum(pattern[..., offset:], entry_values, "b v k g j, b v j k d -> b v k g d")
        z = einops.rearrange(z, "b v k g d -> b v (k g) d")
        if z_override is not None:
            mask, z_new = z_override
            z = torch.where(mask[None, :, :, None], z_new[None, None].to(z.dtype), z)
        return einops.einsum(z, self.W_O, "b v h d, h d m -> b v m")

    def reset_parameters(self, generator: torch.Generator, std: float) -> None:
        with torch.no_grad():
            for p in (self.W_Q, self.W_K, self.W_V):
                p.normal_(0.0, std, generator=generator)
            self.W_O.normal_(0.0, std / (2 * self.cfg.n_layers) ** 0.5, generator=generator)
        if self.compressor is not None:
            self.compressor.reset_parameters(generator, std)
