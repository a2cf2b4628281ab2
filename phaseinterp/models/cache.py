"""Incremental-decoding state: per-layer cached token inputs and compressed entries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch import Tensor

from phaseinterp._checks import check_int


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
    ``variants`` is set on a fork (`fork`): one call of ``variants`` rows per cached row, after
    which the fork is ``spent``.
    """

    layers: list[Optional[LayerCache]] = field(default_factory=list)
    length: int = 0
    variants: Optional[int] = None
    spent: bool = False

    def clone(self) -> "KVCache":
        return KVCache([lc.map(lambda t: t.clone()) if lc else None for lc in self.layers], self.length)

    def copy(self) -> "KVCache":
        """A new cache over the same layer caches (nothing copied): extending one leaves the other as it was."""
        return KVCache(list(self.layers), self.length)

    def repeat_batch(self, n: int) -> "KVCache":
        """Each batch row repeated ``n`` times, interleaved (row b -> rows b*n .. b*n+n-1)."""
        return KVCache(
            [lc.map(lambda t: t.repeat_interleave(n, dim=0)) if lc else None for lc in self.layers], self.length
        )

    def fork(self, variants: int = 1) -> "KVCache":
        """A view of this cache for ONE more call with ``variants`` rows per cached row (row ``r``
        continues cached row ``r // variants``; ``variants`` edits of the next token, say): nothing
        is copied and this cache is not extended. A one-token step over a fork shares the prefix
        between the variants; a longer call repeats the prefix's rows first."""
        variants = check_int("variants", variants, 1)
        return KVCache(list(self.layers), self.length, variants=variants)

    @property
    def batch_size(self) -> int:
        """Rows of the cached prefix (0 while nothing is cached)."""
        first = next((lc for lc in self.layers if lc is not None), None)
        return 0 if first is None else first.h.shape[0]
