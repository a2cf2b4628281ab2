"""Incremental-decoding state: per-layer cached token inputs and compressed entries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch import Tensor


@dataclass
class LayerCache:
    """Everything one layer needs to extend a prefix: per-token inputs and compressed entries.

    With staggered window offsets the last stored entry may not be closed yet for every
    KV head (it is then masked, and recomputed once its window closes).
    """

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
