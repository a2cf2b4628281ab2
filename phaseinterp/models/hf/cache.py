"""What `HookedDeepseekV4`'s cache keeps per layer: the state a step continues from.

A layer's attention at positions ``t >= length`` reads (1) the rotated K = V of the sliding window,
the last ``sliding_window - 1`` positions before ``length``; (2) the compressed entries closed so
far; (3) for the entries still to close, the compressor's per-token projections (K = V and gate
logits, before the slot bias) of their windows: the open window's tokens, and on a CSA layer also the
last closed window's (the older half of the next entry); (4) on a CSA layer the same for the
indexer's own compressor. Its memory is O(window + entries) per layer, never O(T): a prompt of 128K
tokens keeps one window of tokens per layer, plus the entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from torch import Tensor


@dataclass
class CompressionState:
    """One compressor's cache (the layer's main compressor or its indexer's)."""

    entries: Tensor  # [batch, entry, d] the closed entries, rotated
    kv: Tensor  # [batch, pos, halves * d] per-token K = V projections of positions first .. length - 1
    gate: Tensor  # [batch, pos, halves * d] per-token gate logits there (before position_bias)
    first: int  # the absolute position of kv[:, 0] (a window start)

    def map(self, fn: Callable[[Tensor], Tensor]) -> "CompressionState":
        return CompressionState(fn(self.entries), fn(self.kv), fn(self.gate), self.first)


@dataclass
class LayerCache:
    """One decoder layer's cache (module docstring); ``length`` tokens consumed."""

    length: int
    kv: Tensor  # [batch, pos, d_head] rotated K = V of positions length - pos .. length - 1
    compressor: Optional[CompressionState]  # None: a sliding-window-only layer
    indexer: Optional[CompressionState]  # CSA only

    def map(self, fn: Callable[[Tensor], Tensor]) -> "LayerCache":
        return LayerCache(self.length, fn(self.kv), None if self.compressor is None else self.compressor.map(fn),
                          None if self.indexer is None else self.indexer.map(fn))

    @property
    def n_tokens(self) -> int:
        return self.length

    @property
    def batch_size(self) -> int:
        return self.kv.shape[0]


__all__ = ["CompressionState", "LayerCache"]
