"""Incremental-decoding state: `KVCache`, one per call sequence, with one layer cache per layer.

The layer caches are the family's own (`LayerCache` here for `CompressedTransformer`,
`phaseinterp.models.hf.cache.LayerCache` for DeepSeek-V4): each has ``map`` (a tensor function applied
to every tensor), ``n_tokens`` and ``batch_size``; `KVCache` (fork, copy, the one-call rule) is shared."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from phaseinterp._checks import check_int
from phaseinterp.errors import UserInputError


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
    frozen: bool = field(default=False, repr=False, compare=False)  # KVCache.freeze: no in-place edits follow
    _shared: dict = field(default_factory=dict, repr=False, compare=False)

    def map(self, fn) -> "LayerCache":
        return LayerCache(*(fn(t) for t in (self.h, self.k, self.v, self.k_rot, self.k_comp, self.v_comp)))

    def shared(self, lo: int, end: int, n_entries: int) -> tuple[Tensor, Tensor]:
        """Keys and values ``[batch, kv_head, slot, d_head]`` of tokens ``lo .. end - 1`` then the first
        ``n_entries`` entries: what every variant of a step at ``end`` shares. Once `frozen` (and
        gradients off) it is kept, so the steps of many forks of one prefix (an ablation sweep's)
        gather it once; otherwise it is gathered per call, so an in-place edit of the cache is read."""
        key = (lo, end, n_entries, torch.is_inference_mode_enabled())
        if key in self._shared:
            return self._shared[key]
        k, v = (torch.cat([tok[:, lo:end], ent[:, :n_entries]], 1).transpose(1, 2).contiguous()
                for tok, ent in ((self.k_rot, self.k_comp), (self.v, self.v_comp)))
        if self.frozen and not torch.is_grad_enabled():
            self._shared[key] = (k, v)
        return k, v

    @property
    def n_tokens(self) -> int:
        return self.h.shape[1]

    @property
    def batch_size(self) -> int:
        return self.h.shape[0]


@dataclass
class KVCache:
    """Incremental-decoding state of a model of either family (compressor state included).

    Feeding a sequence in pieces through ``model(tokens, cache=cache)`` gives the same
    outputs as one full forward. ``length`` is the number of tokens consumed so far.
    ``variants`` is set on a fork (`fork`): one call of ``variants`` rows per cached row, after
    which the fork is ``spent``.
    """

    layers: list[Any] = field(default_factory=list)  # per layer: the family's layer cache, or None
    length: int = 0
    variants: Optional[int] = None
    spent: bool = False
    layout: Optional[str] = None  # the geometry of the model whose init_cache made it (None: any)

    def clone(self) -> "KVCache":
        return KVCache([lc.map(lambda t: t.clone()) if lc else None for lc in self.layers], self.length,
                       layout=self.layout)

    def copy(self) -> "KVCache":
        """A new cache over the same layer caches (nothing copied): extending one leaves the other as it was."""
        return KVCache(list(self.layers), self.length, layout=self.layout)

    def repeat_batch(self, n: int) -> "KVCache":
        """Each batch row repeated ``n`` (>= 1) times, interleaved (row b -> rows b*n .. b*n+n-1)."""
        n = check_int("n", n, 1)
        return KVCache([lc.map(lambda t: t.repeat_interleave(n, dim=0)) if lc else None for lc in self.layers],
                       self.length, layout=self.layout)

    def freeze(self) -> "KVCache":
        """Declare the cached prefix final: its tensors are not edited in place from now on (extending
        the cache is still allowed: it makes new layer caches). Steps over its forks may then keep
        what they share (`LayerCache.shared`) instead of gathering it per call. Only this cache (and
        the forks and copies made from it afterwards) is frozen: its layer caches become new ones over
        the same tensors, so a cache it was copied from is not. Returns this cache."""
        self.layers = [dataclasses.replace(lc, frozen=True, _shared={}) if isinstance(lc, LayerCache) else lc
                       for lc in self.layers]
        return self

    def fork(self, variants: int = 1) -> "KVCache":
        """A view of this cache for ONE more call with ``variants`` rows per cached row (row ``r``
        continues cached row ``r // variants``; ``variants`` edits of the next token, say): nothing
        is copied and this cache is not extended. A one-token step over a fork shares the prefix
        between the variants; a longer call repeats the prefix's rows first."""
        variants = check_int("variants", variants, 1)
        return KVCache(list(self.layers), self.length, variants=variants, layout=self.layout)

    @staticmethod
    def check(cache: Optional["KVCache"], n_layers: int, first: int, last: int,
              layout: Optional[str] = None) -> tuple[int, Optional[int]]:
        """(the position a call over layers ``first .. last - 1`` starts at, the fork's variants or
        None) of ``cache`` (None: a call without a cache, at position 0); refuses anything but a
        `KVCache` of ``n_layers`` layers made for a model of ``layout`` (another model of the same
        geometry may read it, as in cross-model patching), a spent fork, and layers that hold
        different lengths."""
        if cache is None:
            return 0, None
        if not isinstance(cache, KVCache) or len(cache.layers) != n_layers:
            raise UserInputError(f"cache={type(cache).__name__} is not a KVCache of this model's "
                                 f"{n_layers} layers (model.init_cache())")
        if None not in (layout, cache.layout) and layout != cache.layout:
            raise UserInputError(f"cache was made by a model of another geometry ({cache.layout}) than this one "
                                 f"({layout}): start it with this model's init_cache()")
        if cache.spent:
            raise UserInputError("this fork of a cache (KVCache.fork) has taken its one call; fork the cache again")
        lengths = {0 if lc is None else lc.n_tokens for lc in cache.layers[first:last]}
        if len(lengths) > 1:
            raise UserInputError(f"the cache's layers {first}..{last - 1} hold different numbers of tokens "
                                 f"({sorted(lengths)}): run the same positions through each")
        return lengths.pop(), cache.variants

    def check_rows(self, rows: int, variants: Optional[int]) -> None:
        """Refuse a call of ``rows`` rows that does not continue this cache's rows (times a fork's variants)."""
        if self.batch_size and rows != self.batch_size * (variants or 1):
            want = self.batch_size * (variants or 1)
            raise UserInputError(f"tokens batch {rows} does not match the cache's batch {want}"
                                 + (f" ({self.batch_size} rows x {variants} variants)" if variants else ""))

    @staticmethod
    @contextmanager
    def transaction(cache: Optional["KVCache"]) -> Iterator[None]:
        """One call of the forward over ``cache`` (None: nothing to do): if it raises, an interrupt or a
        hook's error included, the cache is put back as it was before the call (its layer caches are
        replaced, never edited, by a call), so a retry feeds the tokens once."""
        if cache is None:
            yield
            return
        layers, length, spent = list(cache.layers), cache.length, cache.spent
        try:
            yield
        except BaseException:
            cache.layers[:], cache.length, cache.spent = layers, length, spent
            raise

    def after_call(self, variants: Optional[int], ran_last_layer: bool, length: int) -> None:
        """A call over this cache has run: a fork is spent; else, once its last layer ran, ``length`` tokens."""
        if variants is not None:
            self.spent = True
        elif ran_last_layer:
            self.length = length

    @property
    def batch_size(self) -> int:
        """Rows of the cached prefix (0 while nothing is cached)."""
        first = next((lc for lc in self.layers if lc is not None), None)
        return 0 if first is None else first.batch_size


RETURN_TYPES = ("logits", "loss", None, "cache")


def check_return_type(return_type: Any, cache: Optional[KVCache], stop_at_layer: Optional[int]) -> None:
    """Refuse a ``return_type`` of the families' forward that is not one of `RETURN_TYPES`, and
    ``"cache"`` (fill the cache only: the last layer stops once the cache has what later tokens
    read) without a cache to extend, on a fork (which is not extended) or with ``stop_at_layer``."""
    if return_type not in RETURN_TYPES:
        raise UserInputError(f"return_type={return_type!r} is not one of {RETURN_TYPES}")
    if return_type != "cache":
        return
    if cache is None or (isinstance(cache, KVCache) and cache.variants is not None):
        raise UserInputError("return_type='cache' extends a cache and returns nothing: pass "
                             "cache=model.init_cache() (or a cache to extend; a fork is never extended)")
    if stop_at_layer is not None:
        raise UserInputError("return_type='cache' runs every layer; stop_at_layer returns the residual instead: "
                             "pass one of them")


def check_forward(cache: Optional[KVCache], return_type: Any, n_layers: int, start_at_layer: Optional[int],
                  stop_at_layer: Optional[int], layout: Optional[str] = None) -> tuple[int, int, int, Optional[int]]:
    """The checks of a family's forward: ``return_type`` (`check_return_type`), ``start_at_layer`` /
    ``stop_at_layer`` (TransformerLens's; ``"loss"`` takes neither) and ``cache`` (`KVCache.check`).
    Returns (first layer, last layer + 1, the start position, the fork's variants or None)."""
    check_return_type(return_type, cache, stop_at_layer)
    first = 0 if start_at_layer is None else check_int("start_at_layer", start_at_layer, 0, n_layers - 1)
    last = n_layers if stop_at_layer is None else check_int("stop_at_layer", stop_at_layer, first + 1, n_layers)
    if return_type == "loss" and (start_at_layer is not None or stop_at_layer is not None):
        raise UserInputError("return_type='loss' needs the tokens: it takes no start_at_layer / stop_at_layer")
    return (first, last, *KVCache.check(cache, n_layers, first, last, layout))
