"""Grouped-query attention over exact local tokens plus compressed window entries.

Each query ``t`` runs ONE softmax over (docs/science.md section 2):

(a) exact K/V of a band of recent tokens -- the last ``L = local_window`` tokens
    (``memory="local"``, the query included), or only the tokens not yet covered by a
    closed window (``memory="uncompressed_tail"``);
(b) every compressed entry ``j`` whose window has closed: ``j*S + o + W - 1 <= t``.

``o`` is the KV head's window offset (`CompressedConfig.window_offsets`; 0 for the
paper's shared grid): KV head ``h`` compresses windows starting at ``j*S + o_h``.

Key-slot layout of ``hook_attn_scores`` / ``hook_pattern`` ``[batch, head, query_pos, key_slot]``:
slots ``0 .. B-1`` are the band, oldest first (slot ``s`` of query ``t`` holds source
position ``t - B + 1 + s``; slot ``B-1`` is the query itself), then slot ``B + j`` is
compressed entry ``j`` (of the head's own grid). ``B = band_width`` is ``L`` for local
memory and ``max(W, S) - 1`` (at least 1, plus the largest offset) for the uncompressed
tail. Invalid slots (before the sequence start, outside the tail, entries not yet closed)
hold ``-inf`` scores and zero probability. `CompressedAttention.key_slot_sources` maps
slots back to positions. The full-attention baseline uses plain positions as key slots.
HookedDeepseekV4 shows the same layout (docs/hooks.md).

Positions: queries and band keys are rotated at their own position; compressed keys at
``j*S + o + W - S`` (DeepSeek-V4's convention: the first token of the window's newest
S-block; equals ``j`` when W = S = 1). QK-norm, when on, normalises queries, band keys
and compressed keys alike. Values are never rotated.

The specification, one query at a time: `phaseinterp.models.reference`. One forward (`CompressedAttention.forward`): the
new tokens' K/V appended to the cache, then one softmax per query, evaluated by torch's fused
kernel unless a hook reads the scores or the pattern (docs/models.md, "One forward").
"""

from __future__ import annotations

from typing import Optional, Union

import einops
import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from phaseinterp._checks import check_int
from phaseinterp.config import CompressedConfig
from phaseinterp.models.cache import LayerCache
from phaseinterp.models.compressor import Compressor, RMSNorm, rms_norm
from phaseinterp.models.paths import has_hooks, query_context
from phaseinterp.models.rope import apply_rope, rotary_tables
from phaseinterp.phase import n_closed_windows, n_visible_entries, tail_start, window_positions

# Query chunking under ``query_chunk = "auto"`` (`CompressedAttention.query_ranges`): a forward
# over more than AUTO_CHUNK_ABOVE new tokens runs its queries in chunks whose score block holds
# at most SCORE_BLOCK elements per prompt row (query heads x queries x key slots; 8 MiB in float32):
# chunks depend on the length and the model, never on the batch size.
AUTO_CHUNK_ABOVE = 2048
SCORE_BLOCK = 1 << 21
MIN_AUTO_CHUNK = 16
# Queries per block of `BlockBand` (at least the band width): one dense [block, block + B - 1] score matmul each.
BAND_BLOCK = 16
# Queries per block of compressed attention under torch's fused kernel (`CompressedAttention._attend_sdpa`), at most.
FUSED_BLOCK = 128


class GatheredBand:
    """Band keys gathered per query (``k``, ``v``: ``[batch, query, slot, kv_head, d_head]``): the
    layout of a step over a fork (`CompressedAttention._attend_variants`), whose variants each bring
    their own keys."""

    def __init__(self, k: Tensor, v: Tensor):
        self.k, self.v, self.width = k, v, k.shape[2]

    def scores(self, qg: Float[Tensor, "batch query kv_head group d_head"]) -> Float[Tensor, "batch kv_head group query slot"]:
        return einops.einsum(qg, self.k, "b t k g d, b t s k d -> b k g t s")

    def mix(self, p: Float[Tensor, "batch kv_head group query slot"]) -> Float[Tensor, "batch query kv_head group d_head"]:
        return einops.einsum(p, self.v, "b k g t s, b t s k d -> b t k g d")


class BlockBand:
    """The band of ``n`` consecutive queries at positions ``p0 ..`` read from the cached keys
    ``k``/``v`` (``[batch, pos, kv_head, d_head]``, positions ``0 ..``) without gathering them.

    Slot ``s`` of the query at ``t`` holds position ``t - B + 1 + s`` (B = ``width``). The queries
    are split into blocks of ``block``; a block's queries read one contiguous key window of
    ``block + B - 1`` positions (an `unfold` view: no copy), so each block's scores are one dense
    ``[block, block + B - 1]`` matmul whose skewed diagonal ``[block, B]`` is the band (a strided
    view), and the pattern goes back through the same view. The same slots and numbers as
    `GatheredBand` (to 1e-5), without a ``[query, B, d_head]`` copy per query. Positions before 0 read
    zeros (their slots are masked)."""

    def __init__(self, k: Tensor, v: Tensor, p0: int, n: int, width: int, block: Optional[int] = None):
        self.width = width
        self.block = c = min(n, block or max(width, BAND_BLOCK))
        self.n_blocks = nb = -(-n // c)
        self.span = c + width - 1
        lo, hi = p0 - width + 1, p0 + nb * c  # key positions the blocks read, [lo, hi)
        self.k_win, self.v_win = (self._windows(t, lo, hi) for t in (k, v))  # [b, n_blocks, kv, d, span]

    def _windows(self, t: Tensor, lo: int, hi: int) -> Tensor:
        front, back = max(0, -lo), max(0, hi - t.shape[1])
        src = t[:, max(lo, 0): min(hi, t.shape[1])]
        if front or back:
            src = torch.cat([src.new_zeros(src.shape[0], front, *src.shape[2:]), src,
                             src.new_zeros(src.shape[0], back, *src.shape[2:])], 1)
        return src.unfold(1, self.span, self.block)

    def _skew(self, dense: Tensor) -> Tensor:
        """The band ``[b, n_blocks, kv, g, block, B]`` of contiguous ``dense`` ``[..., block, span]``:
        element (i, s) is (i, i + s)."""
        st = dense.stride()
        return dense.as_strided(dense.shape[:-1] + (self.width,), st[:-2] + (self.span + 1, 1), dense.storage_offset())

    def scores(self, qg: Float[Tensor, "batch query kv_head group d_head"]) -> Float[Tensor, "batch kv_head group query slot"]:
        b, t, k, g, d = qg.shape
        c, nb = self.block, self.n_blocks
        q = qg if nb * c == t else torch.cat([qg, qg.new_zeros(b, nb * c - t, k, g, d)], 1)
        q = q.reshape(b, nb, c, k, g, d).permute(0, 1, 3, 4, 2, 5).reshape(b, nb, k, g * c, d)
        dense = torch.matmul(q, self.k_win).view(b, nb, k, g, c, self.span)  # [b, nb, kv, g, c, span]
        band = self._skew(dense).permute(0, 2, 3, 1, 4, 5).reshape(b, k, g, nb * c, self.width)
        return band[:, :, :, :t]

    def mix(self, p: Float[Tensor, "batch kv_head group query slot"]) -> Float[Tensor, "batch query kv_head group d_head"]:
        b, k, g, t, B = p.shape
        c, nb = self.block, self.n_blocks
        if nb * c != t:
            p = torch.cat([p, p.new_zeros(b, k, g, nb * c - t, B)], 3)
        dense = p.new_zeros(b, nb, k, g, c, self.span)
        self._skew(dense).copy_(p.reshape(b, k, g, nb, c, B).permute(0, 3, 1, 2, 4, 5))
        z = torch.matmul(dense.view(b, nb, k, g * c, self.span), self.v_win.transpose(-1, -2))  # [b, nb, kv, g c, d]
        z = z.view(b, nb, k, g, c, -1).permute(0, 1, 4, 2, 3, 5).reshape(b, nb * c, k, g, -1)
        return z[:, :t]


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
        # Window offset of each KV head (all 0 on the paper's shared grid).
        self.window_offsets: tuple[int, ...] = tuple(cfg.layer_window_offsets(layer))
        self.register_buffer("offsets", torch.tensor(self.window_offsets), persistent=False)
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
    def staggered(self) -> bool:
        return any(self.window_offsets)

    @property
    def band_width(self) -> int:
        cfg = self.cfg
        if not cfg.is_compressed:
            return 0
        if cfg.memory == "local":
            return cfg.local_window
        return max(cfg.window - 1, cfg.stride - 1, 1) + max(self.window_offsets)

    def key_slot_sources(
        self, query_pos: int, n_key_slots: Optional[int] = None, kv_head: int = 0
    ) -> list[tuple[str, list[int]]]:
        """For a query at ``query_pos`` reading KV head ``kv_head``: ``(kind, source positions)``
        for every key slot.

        ``kind`` is ``"local"``, ``"entry"`` or ``"masked"`` (``"token"`` for full
        attention). Entries list the W positions of their window.
        """
        cfg = self.cfg
        query_pos = check_int("query_pos", query_pos, 0, cfg.n_ctx - 1)
        kv_head = check_int("kv_head", kv_head, 0, cfg.n_kv_heads - 1)
        if not cfg.is_compressed:
            n = query_pos + 1 if n_key_slots is None else check_int(
                "n_key_slots", n_key_slots, query_pos + 1, why=f" (the keys of a query at position {query_pos})")
            return [("token", [p]) if p <= query_pos else ("masked", []) for p in range(n)]
        W, S, o, B = cfg.window, cfg.stride, self.window_offsets[kv_head], self.band_width
        if n_key_slots is not None:  # the band of B slots, then at least the entries this query sees
            n_key_slots = check_int("n_key_slots", n_key_slots, B + n_visible_entries(query_pos, W, S, o),
                                    why=f" (a band of {B} slots, then the {n_visible_entries(query_pos, W, S, o)} "
                                        f"entries a query at position {query_pos} sees)")
        lower = query_pos - B + 1 if cfg.memory == "local" else tail_start(query_pos, W, S, o)
        out: list[tuple[str, list[int]]] = []
        for s in range(B):
            p = query_pos - B + 1 + s
            out.append(("local", [p]) if p >= max(lower, 0) else ("masked", []))
        n_entries = n_visible_entries(query_pos, W, S, o)
        total = n_key_slots - B if n_key_slots is not None else n_entries
        for j in range(total):
            out.append(("entry", list(window_positions(j, W, S, o))) if j < n_entries else ("masked", []))
        return out

    # ------------------------------------------------------------------ masks
    def _band_allowed(
        self, query_pos: Int[Tensor, " query"], key_pos: Int[Tensor, "*query key"]
    ) -> Bool[Tensor, "kv_head query key"]:
        """Exact token ``key_pos`` is in the band of query ``query_pos`` (per KV head: the
        uncompressed tail starts after the head's last closed window)."""
        cfg = self.cfg
        if key_pos.ndim == 1:
            key_pos = key_pos.expand(query_pos.shape[0], -1)
        ok = (key_pos >= 0) & (key_pos <= query_pos[:, None])
        if cfg.is_compressed and cfg.memory == "local":
            ok = ok & (key_pos > query_pos[:, None] - cfg.local_window)
        ok = ok[None].expand(cfg.n_kv_heads, -1, -1)
        if cfg.is_compressed and cfg.memory == "uncompressed_tail":
            lower = tail_start(query_pos[None, :], cfg.window, cfg.stride, self.offsets[:, None])  # [kv, t]
            ok = ok & (key_pos[None] >= lower[..., None])
        return ok

    def _entry_allowed(
        self, query_pos: Int[Tensor, " query"], entries: Int[Tensor, " entry"]
    ) -> Bool[Tensor, "kv_head query entry"]:
        """Entry ``j`` of KV head ``h`` is visible to query ``t`` iff ``j*S + o_h + W - 1 <= t``."""
        cfg = self.cfg
        visible = n_visible_entries(query_pos[None, :], cfg.window, cfg.stride, self.offsets[:, None])  # [kv, t]
        return entries[None, None, :] < visible[..., None]

    # ---------------------------------------------------------------- compress
    def _rope(self, x: Tensor, positions: Tensor) -> Tensor:
        return apply_rope(x, self.rope_cos[positions], self.rope_sin[positions], self.cfg.rotary_dims)

    def _compress(
        self,
        h: Float[Tensor, "batch pos d_model"],
        k: Float[Tensor, "batch pos kv_head d_head"],
        v: Float[Tensor, "batch pos kv_head d_head"],
        first: int,
        j: Int[Tensor, " win"],
    ) -> tuple[Float[Tensor, "batch win kv_head d_head"], Float[Tensor, "batch win kv_head d_head"]]:
        """Entries of windows ``j`` from per-token inputs whose index 0 is position ``first``.

        The compressor maths is in `Compressor`; here: gather each window's tokens, then
        normalise (DeepSeek's kv_norm, or QK-norm on keys) and rotate the keys at
        ``j*S + o + W - S``. Slots past the given tokens (a window not yet closed for a
        staggered head) read the last token; such entries are masked until recomputed.
        """
        points = [m for m in self.compressor.modules() if isinstance(m, HookPoint) and has_hooks(m)]
        if not points:
            return self._compress_windows(h, k, v, first, j)
        for point in points:  # which entries this call computes: hook.ctx["entry_range"] == (j0, j1)
            point.ctx["entry_range"] = (int(j[0]), int(j[-1]) + 1) if len(j) else (0, 0)
        try:
            return self._compress_windows(h, k, v, first, j)
        finally:
            for point in points:
                point.ctx.pop("entry_range", None)

    def _compress_windows(self, h: Tensor, k: Tensor, v: Tensor, first: int, j: Tensor) -> tuple[Tensor, Tensor]:
        cfg = self.cfg
        W, S = cfg.window, cfg.stride
        start = j * S  # [win]
        slots = torch.arange(W, device=h.device)
        if self.staggered:  # per-head windows: token index [win, slot, kv_head]
            idx = (start[:, None, None] + slots[None, :, None] + self.offsets - first).clamp(max=h.shape[1] - 1)
            heads = torch.arange(cfg.n_kv_heads, device=h.device)
            k_hat, v_hat = self.compressor(h[:, idx], k[:, idx, heads], v[:, idx, heads])
            rot_pos = start[:, None] + self.offsets + W - S  # [win, kv_head]
        else:
            idx = start[:, None] + slots[None, :] - first  # [win, slot]
            k_hat, v_hat = self.compressor(h[:, idx], k[:, idx], v[:, idx])
            rot_pos = start + W - S
        comp = self.compressor
        if cfg.compression == "deepseek":  # one K = V entry: normalised once, the key rotated
            v_hat = comp.hook_normed_kv_compressed(rms_norm(k_hat, comp.kv_norm_weight, cfg.norm_eps))
            return comp.hook_rot_kv_compressed(self._rope(v_hat, rot_pos)), v_hat
        if cfg.qk_norm:
            k_hat = self.k_norm.unhooked(k_hat)
        return comp.hook_rot_k_compressed(self._rope(k_hat, rot_pos)), v_hat

    def _entry_range(self, before: int, after: int) -> tuple[int, int]:
        """Entries to (re)compute when the sequence grows from ``before`` to ``after`` tokens:
        from the first not closed for every head to the last closed for some head."""
        W, S, o = self.cfg.window, self.cfg.stride, self.window_offsets
        return n_closed_windows(before, W, S, max(o)), n_closed_windows(after, W, S, min(o))

    # ----------------------------------------------------------------- attend
    def _project(self, x: Tensor, positions: Tensor, with_q: bool = True) -> tuple[Optional[Tensor], Tensor, Tensor, Tensor]:
        """q (rotated; None without ``with_q``), k, v, k (normalised, rotated) of new tokens at ``positions``."""
        q = self.hook_q(einops.einsum(x, self.W_Q, "b t m, h m d -> b t h d")) if with_q else None
        k = self.hook_k(einops.einsum(x, self.W_K, "b t m, k m d -> b t k d"))
        v = self.hook_v(einops.einsum(x, self.W_V, "b t m, k m d -> b t k d"))
        k_normed = k
        if self.cfg.qk_norm:
            q, k_normed = self.q_norm(q) if with_q else None, self.k_norm(k)
        q_rot = self.hook_rot_q(self._rope(q, positions)) if with_q else None
        return q_rot, k, v, self.hook_rot_k(self._rope(k_normed, positions))

    def _attend(
        self,
        q: Float[Tensor, "batch query head d_head"],
        band: Union["GatheredBand", "BlockBand"],
        k_shared: Float[Tensor, "batch kv_head shared d_head"],
        v_shared: Float[Tensor, "batch kv_head shared d_head"],
        allowed: Bool[Tensor, "kv_head _query slot"],
    ) -> Float[Tensor, "batch query head d_head"]:
        """``z = pattern V``, ``pattern`` = the scores ``q.k / sqrt(d_head)`` of the allowed key
        slots normalised over all slots ``[band | shared]`` at once: the explicit softmax, which
        ``hook_attn_scores`` and ``hook_pattern`` see. ``band`` keys belong to one query (its band:
        `GatheredBand` or `BlockBand`, the same slots either way), ``shared`` keys to every query
        (entries, or all tokens for full attention)."""
        cfg = self.cfg
        qg = einops.rearrange(q, "b t (k g) d -> b t k g d", k=cfg.n_kv_heads)
        scores = torch.cat([band.scores(qg), einops.einsum(qg, k_shared, "b t k g d, b k j d -> b k g t j")], dim=-1)
        scores.mul_(cfg.d_head**-0.5)
        scores.masked_fill_(~allowed[:, None], float("-inf"))  # [kv_head, 1 (group), query, slot]
        scores = self.hook_attn_scores(einops.rearrange(scores, "b k g t s -> b (k g) t s"))
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        pattern = einops.rearrange(pattern, "b (k g) t s -> b k g t s", k=cfg.n_kv_heads)
        n_own = band.width
        z = band.mix(pattern[..., :n_own])
        z = z + einops.einsum(pattern[..., n_own:], v_shared, "b k g t j, b k j d -> b t k g d")
        return einops.rearrange(z, "b t k g d -> b t (k g) d")

    def _output(self, z: Float[Tensor, "batch pos head d_head"]) -> Float[Tensor, "batch pos d_model"]:
        if self.cfg.use_attn_result:
            return self.hook_result(einops.einsum(z, self.W_O, "b t h d, h d m -> b t h m")).sum(dim=2)
        return einops.einsum(z, self.W_O, "b t h d, h d m -> b t m")

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        cache: Optional[LayerCache] = None,
        start: int = 0,
        variants: Optional[int] = None,
        cache_only: bool = False,
    ) -> tuple[Optional[Float[Tensor, "batch pos d_model"]], Optional[LayerCache]]:
        """Attention for the ``pos`` new tokens at positions ``start ..``, given the cached prefix;
        returns the output and the layer cache extended by the new tokens (the windows they close
        compressed).

        One computation, two ways to evaluate the softmax: torch's ``scaled_dot_product_attention``
        while no hook reads ``hook_attn_scores`` or ``hook_pattern`` (`_attend_sdpa`), else the
        explicit softmax over the key-slot layout those hooks see (`_attend_slots`). Every other hook
        point fires in both, on the ``pos`` new positions.

        ``variants`` (a fork of the cache, `KVCache.fork`): ``x`` holds ``variants`` rows per cached
        row (row ``r`` continues cached row ``r // variants``). A one-token step attends every variant
        to the shared prefix without copying it (`_attend_variants`) and returns no cache (a fork takes
        one step); otherwise the prefix's rows are repeated first.

        ``cache_only``: only the cache is extended (keys, values and the windows the tokens close); no
        query, score or output is computed, and the hooks after ``hook_rot_k`` do not fire. Returns
        ``(None, cache)``.
        """
        n = x.shape[1]
        positions = torch.arange(start, start + n, device=x.device)
        if cache_only:  # what later tokens read: keys, values, entries; no query, no output
            _, k, v, k_rot = self._project(x, positions, with_q=False)
            return None, self._extend(cache, x, k, v, k_rot, start)
        q_rot, k, v, k_rot = self._project(x, positions)
        hooked = self._scores_hooked()
        if variants is not None and cache is not None:
            if n == 1 and not hooked:
                z = self._attend_variants(x, q_rot, k, v, k_rot, cache, start, variants)
                return self._output(self._hook_z(z, start, n)), None
            if variants > 1:
                cache = cache.map(lambda t: t.repeat_interleave(variants, 0))
        cache = self._extend(cache, x, k, v, k_rot, start)
        z = (self._attend_slots if hooked else self._attend_sdpa)(q_rot, cache, positions, start)
        return self._output(self._hook_z(z, start, n)), cache

    def _hook_z(self, z: Tensor, start: int, n: int) -> Tensor:
        with query_context([self.hook_z], start, start + n):
            return self.hook_z(z)

    # Queries per attention block: "auto" (the default), None (all at once) or a fixed count. An
    # execution setting, not part of the architecture: `CompressedTransformer.set_query_chunk`.
    query_chunk: Union[int, str, None] = "auto"

    def n_key_slots(self, query_pos: int) -> int:
        """Key slots a query at ``query_pos`` can see: the band plus its visible entries (every
        earlier token for full attention)."""
        cfg = self.cfg
        if not cfg.is_compressed:
            return query_pos + 1
        return self.band_width + n_visible_entries(query_pos, cfg.window, cfg.stride, min(self.window_offsets))

    def query_ranges(self, start: int, n: int) -> Optional[list[tuple[int, int]]]:
        """Query blocks ``[(a, b), ...]`` (indices into the ``n`` new tokens) of `_attend_sdpa`, or
        None for one block of all queries.

        ``query_chunk = None``: None. An integer c: blocks of c queries (None when c >= n).
        ``"auto"``: full attention, None up to `AUTO_CHUNK_ABOVE` new tokens, above that as many
        queries per block as keep one prompt row's score block ``n_heads * queries * key_slots``
        within `SCORE_BLOCK` elements (at least `MIN_AUTO_CHUNK`); compressed attention, blocks of
        at most `FUSED_BLOCK` queries with ``n_heads * queries * keys <= 4 * SCORE_BLOCK``. Time
        grows like the compute ``T * (L + T/S)`` and peak memory linearly in T. Blocks depend on
        the length, the model and the setting, never on the batch size.
        """
        chunk = self.query_chunk
        if chunk is None or (chunk != "auto" and chunk >= n):
            return None
        if chunk != "auto":
            return [(a, min(a + chunk, n)) for a in range(0, n, chunk)]
        if self.cfg.is_compressed:
            return self._fused_blocks(start, n)
        if n <= AUTO_CHUNK_ABOVE:
            return None
        ranges, a, per_query_slot, size = [], 0, self.cfg.n_heads, n
        fits = lambda a, size: per_query_slot * size * self.n_key_slots(start + a + size - 1) <= SCORE_BLOCK  # noqa: E731
        while a < n:
            # the largest size that fits (bisection; sizes only shrink as the visible keys grow)
            low, high = MIN_AUTO_CHUNK, min(size, n - a)
            if high <= low or fits(a, high):
                low = max(high, 1)
            while high - low > 1:
                mid = (low + high) // 2
                low, high = (mid, high) if fits(a, mid) else (low, mid)
            size = low
            ranges.append((a, min(a + size, n)))
            a += size
        return ranges

    def _fused_blocks(self, start: int, n: int) -> list[tuple[int, int]]:
        """Compressed attention's blocks under ``"auto"``: at most `FUSED_BLOCK` queries, the mask and
        the kernel's scores within ``head * block * keys <= 4 * SCORE_BLOCK`` per prompt row."""
        cfg = self.cfg
        W, S, B = cfg.window, cfg.stride, self.band_width
        out, a = [], 0
        while a < n:
            keys_est = B + n_visible_entries(start + min(n - 1, a + FUSED_BLOCK - 1), W, S, min(self.window_offsets)) \
                + FUSED_BLOCK
            size = max(16, min(FUSED_BLOCK, (4 * SCORE_BLOCK) // max(1, cfg.n_heads * keys_est)))
            out.append((a, min(n, a + size)))
            a = out[-1][1]
        return out

    def _scores_hooked(self) -> bool:
        """A hook reads or edits ``hook_attn_scores``/``hook_pattern``: the explicit softmax runs."""
        return has_hooks(self.hook_attn_scores) or has_hooks(self.hook_pattern)

    def _attend_slots(
        self,
        q_rot: Float[Tensor, "batch query head d_head"],
        cache: LayerCache,
        positions: Int[Tensor, " query"],
        start: int,
    ) -> Float[Tensor, "batch query head d_head"]:
        """z of the queries at ``positions`` (``start ..``) over ``cache`` by the explicit softmax over the key-slot
        layout (module docstring): (a) the band, gathered per query; (b) the entries, shared (every
        earlier token for full attention). ``hook_attn_scores`` and ``hook_pattern`` see
        ``[batch, head, query, key_slot]`` with every key slot of the layer."""
        cfg = self.cfg
        device = q_rot.device
        if not cfg.is_compressed:
            empty = q_rot.new_zeros(q_rot.shape[0], q_rot.shape[1], 0, cfg.n_kv_heads, cfg.d_head)
            keys = torch.arange(cache.k_rot.shape[1], device=device)
            return self._attend(q_rot, GatheredBand(empty, empty), cache.k_rot.transpose(1, 2),
                                cache.v.transpose(1, 2), self._band_allowed(positions, keys))
        B = self.band_width
        band_pos = positions[:, None] - B + 1 + torch.arange(B, device=device)
        band = BlockBand(cache.k_rot, cache.v, start, q_rot.shape[1], B)
        entries = torch.arange(cache.k_comp.shape[1], device=device)
        allowed = torch.cat([self._band_allowed(positions, band_pos), self._entry_allowed(positions, entries)], -1)
        return self._attend(q_rot, band, cache.k_comp.transpose(1, 2), cache.v_comp.transpose(1, 2), allowed)

    def _attend_sdpa(
        self,
        q_rot: Float[Tensor, "batch query head d_head"],
        cache: LayerCache,
        positions: Int[Tensor, " query"],
        start: int,
    ) -> Float[Tensor, "batch query head d_head"]:
        """The same joint softmax as `_attend_slots` by torch's fused ``scaled_dot_product_attention``,
        per block of queries (`query_ranges`). A block of queries at ``first .. last`` takes as keys the
        tokens it can see (compressed: ``first - B + 1 .. last``, its bands, and the entries visible to
        ``last``; full attention: ``0 .. last``) under a mask (`_band_allowed` & ``key > query - B`` /
        `_entry_allowed`). Equal to the explicit softmax to 1e-5."""
        cfg = self.cfg
        device = q_rot.device
        n, p0 = q_rot.shape[1], start
        B = self.band_width
        out = []
        for a, b in self.query_ranges(p0, n) or [(0, n)]:
            first, last = p0 + a, p0 + b - 1
            qp = positions[a:b]
            if cfg.is_compressed:
                lo = max(0, first - B + 1)
                key_pos = torch.arange(lo, last + 1, device=device)
                n_entries = n_visible_entries(last, cfg.window, cfg.stride, min(self.window_offsets))
                band_ok = self._band_allowed(qp, key_pos) & (key_pos[None, None, :] > qp[None, :, None] - B)
                mask = torch.cat([band_ok, self._entry_allowed(qp, torch.arange(n_entries, device=device))], -1)
                k = torch.cat([cache.k_rot[:, lo:last + 1], cache.k_comp[:, :n_entries]], 1)
                v = torch.cat([cache.v[:, lo:last + 1], cache.v_comp[:, :n_entries]], 1)
            else:
                k, v = cache.k_rot[:, :last + 1], cache.v[:, :last + 1]
                mask = None if first == 0 and b - a == last + 1 else (  # queries 0 .. n-1: the causal triangle
                    torch.arange(last + 1, device=device) <= qp[:, None])[None]
            out.append(self._sdpa(q_rot[:, a:b], k, v, mask))
        return torch.cat(out, 1) if len(out) > 1 else out[0]

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
        """``scaled_dot_product_attention`` of ``q`` ``[b, C, head, d]`` over ``k``, ``v`` ``[b, key,
        kv_head, d]`` under ``mask`` ``[kv_head or 1, C, key]`` (None: causal over keys 0 .. C - 1).
        Query head h reads KV head h // group: the group's queries stacked along the query axis
        (``[b, kv, group * C, d]``), so K and V are not copied per query head."""
        cfg = self.cfg
        batch, C = q.shape[0], q.shape[1]
        group, KV = cfg.n_heads // cfg.n_kv_heads, cfg.n_kv_heads
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if mask is None:  # the causal triangle: one kernel call with is_causal
            if group > 1:
                k, v = (t[:, :, None].expand(-1, -1, group, -1, -1).flatten(1, 2) for t in (k, v))
            z = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, scale=cfg.d_head**-0.5)
            return z.transpose(1, 2)
        qg = q.transpose(1, 2).reshape(batch, KV, group * C, cfg.d_head)
        mask = mask.expand(KV, -1, -1)[:, None].expand(-1, group, -1, -1).reshape(KV, group * C, -1)
        bias = torch.where(mask, 0.0, float("-inf")).to(q.dtype)
        z = F.scaled_dot_product_attention(qg, k, v, attn_mask=bias[None], scale=cfg.d_head**-0.5)
        return z.view(batch, cfg.n_heads, C, cfg.d_head).transpose(1, 2)

    def _extend(self, cache: Optional[LayerCache], x, k, v, k_rot, start: int) -> LayerCache:
        """The layer cache with the new tokens appended and newly closed windows compressed."""
        if cache is None:
            no_entries = x.new_zeros(x.shape[0], 0, self.cfg.n_kv_heads, self.cfg.d_head)
            grown = LayerCache(x, k, v, k_rot, no_entries, no_entries.clone())
        else:
            cat = lambda old, new: torch.cat([old, new], 1)  # noqa: E731
            grown = LayerCache(cat(cache.h, x), cat(cache.k, k), cat(cache.v, v), cat(cache.k_rot, k_rot),
                               cache.k_comp, cache.v_comp)
        if self.cfg.is_compressed:
            first, last = self._entry_range(start, start + x.shape[1])
            if last > first:
                k_new, v_new = self._compress(grown.h, grown.k, grown.v, 0, torch.arange(first, last, device=x.device))
                grown.k_comp = torch.cat([grown.k_comp[:, :first], k_new], 1)
                grown.v_comp = torch.cat([grown.v_comp[:, :first], v_new], 1)
        return grown

    def _attend_variants(self, x, q_rot, k, v, k_rot, cache: LayerCache, pos: int, n_var: int) -> Tensor:
        """z ``[batch * variant, 1, head, d_head]`` of ONE new token (position ``pos``) in ``n_var``
        variants per cached row, over the shared prefix ``cache`` (never copied): the variants are
        the queries of `_attend`; each sees its own token's K/V and the entries whose window that
        token closes (computed per variant), then the shared band and entries of the prefix."""
        cfg = self.cfg
        batch = cache.h.shape[0]
        query = torch.tensor([pos], device=x.device)
        per_variant = lambda t: t.reshape(batch, n_var, *t.shape[1:])  # noqa: E731  [b, v, 1, ...]
        q_rot = per_variant(q_rot)[:, :, 0]
        k_own, v_own = per_variant(k_rot), per_variant(v)
        allowed = [self._band_allowed(query, query[None])]
        lo = max(pos - self.band_width + 1, 0) if cfg.is_compressed else 0
        allowed.append(self._band_allowed(query, torch.arange(lo, pos, device=x.device)))  # the prefix's band
        first = 0
        if cfg.is_compressed:
            first, last = self._entry_range(pos, pos + 1)
            if last > first:  # entries that read the new token: one set per variant
                j = torch.arange(first, last, device=x.device)
                lo_win = first * cfg.stride
                tokens = [torch.cat([old[:, lo_win:].repeat_interleave(n_var, 0), new], 1)
                          for old, new in ((cache.h, x), (cache.k, k), (cache.v, v))]
                k_new, v_new = self._compress(*tokens, lo_win, j)
                k_own, v_own = torch.cat([k_own, per_variant(k_new)], 2), torch.cat([v_own, per_variant(v_new)], 2)
                allowed.insert(1, self._entry_allowed(query, j))
            allowed.append(self._entry_allowed(query, torch.arange(first, device=x.device)))
        k_shared, v_shared = cache.shared(lo, pos, first)
        z = self._attend(q_rot, GatheredBand(k_own, v_own), k_shared, v_shared, torch.cat(allowed, -1))
        return z.reshape(batch * n_var, 1, cfg.n_heads, cfg.d_head)

    def reset_parameters(self, generator: torch.Generator, std: float) -> None:
        with torch.no_grad():
            for p in (self.W_Q, self.W_K, self.W_V):
                p.normal_(0.0, std, generator=generator)
            self.W_O.normal_(0.0, std / (2 * self.cfg.n_layers) ** 0.5, generator=generator)
        if self.compressor is not None:
            self.compressor.reset_parameters(generator, std)
