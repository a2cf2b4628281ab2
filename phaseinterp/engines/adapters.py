"""Engines: anything that maps a batch of token ids to next-token log-probs, and the schedules that
feed a prompt to an incremental cache (one forward, token by token, or in pieces).

`Engine`: ``engine(tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_vocab"]``, the log-probs
of the token after each row (``NaN`` where not reported; rows of one call share a length).
`WarmEngine` adds ``engine.warm(donors, tokens, prefix_len)``: each prompt answered right after a donor
sharing its first ``prefix_len`` tokens, reusing that cache. In process: `CacheEngine` (own
`KVCache`) and `TransformersEngine` (a Hugging Face causal LM and its cache classes)."""

from __future__ import annotations

import copy
import inspect
from typing import Callable, Optional, Protocol, Sequence, runtime_checkable

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformers import DynamicCache

from phaseinterp._checks import check_int
from phaseinterp.errors import UserInputError
from phaseinterp.models.cache import KVCache, LayerCache
from phaseinterp.models.protocol import phase_model
from phaseinterp.models.paths import refuse_hooks

Schedule = Callable[[int], Sequence[int]]  # prompt length -> piece lengths (they sum to the length)


@runtime_checkable
class Engine(Protocol):
    """Next-token log-probs after the last token of each row (``NaN`` = not reported)."""

    name: str

    def __call__(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_vocab"]: ...


@runtime_checkable
class WarmEngine(Engine, Protocol):
    """An `Engine` that can reuse a cached prefix: ``warm(donors, tokens, prefix_len)`` feeds each
    row of ``donors`` (same length as ``tokens``, equal to it on the first ``prefix_len`` tokens),
    then answers the row of ``tokens`` from its cache of those ``prefix_len`` tokens, computing only
    ``tokens[:, prefix_len:]``. Returns the log-probs after each row of ``tokens``."""

    def warm(self, donors: Int[Tensor, "batch pos"], tokens: Int[Tensor, "batch pos"],
             prefix_len: int) -> Float[Tensor, "batch d_vocab"]: ...


def check_warm_rows(donors: Tensor, tokens: Tensor, prefix_len: int) -> None:
    """`UserInputError` unless ``donors`` and ``tokens`` have one shape, share their first
    ``prefix_len`` tokens, and ``prefix_len`` leaves at least one token of ``tokens`` to compute."""
    if donors.shape != tokens.shape or tokens.ndim != 2:
        raise UserInputError(f"donors {tuple(donors.shape)} and tokens {tuple(tokens.shape)} must be one [batch, pos] "
                             "shape")
    prefix_len = check_int("prefix_len", prefix_len, 1, tokens.shape[1] - 1,
                           why=f" (prompts of {tokens.shape[1]} tokens)")
    if not torch.equal(donors[:, :prefix_len].cpu(), tokens[:, :prefix_len].cpu()):
        raise UserInputError(f"donors and tokens differ within the first prefix_len={prefix_len} tokens")


# ------------------------------------------------------------------------------- schedules
def full_pieces(length: int) -> list[int]:
    """The whole prompt in one call to the cache (a cached prefill)."""
    return [length]


def decode_pieces(length: int) -> list[int]:
    """Token-by-token decoding: ``length`` pieces of one token."""
    return [1] * length


def chunked_pieces(length: int, cut_phase: int, period: int, chunk: int) -> list[int]:
    """Prefill in pieces whose every cut falls at ``cut_phase`` (mod ``period``), then decode.

    A cut at ``c`` ends a piece at ``c - 1``. The first piece ends at the first cut, later pieces are
    ``chunk`` tokens (a multiple of ``period``), and the last prefill piece stops at the last ``e <=
    length - 1`` with ``e = cut_phase (mod period)``; tokens ``e .. length-1`` are decoded one at a time."""
    if chunk % period:
        raise UserInputError(f"chunk={chunk} must be a multiple of the cut period {period}")
    first = cut_phase if cut_phase > 0 else period
    last_cut = length - 1 - ((length - 1 - cut_phase) % period)  # largest e <= length-1, e = cut_phase mod period
    if last_cut < first:
        raise UserInputError(f"a prompt of {length} tokens is too short for cuts at phase {cut_phase} mod {period}")
    pieces, pos = [first], first
    while pos < last_cut:
        step = min(chunk, last_cut - pos)
        pieces.append(step)
        pos += step
    return pieces + [1] * (length - last_cut)


def _check_pieces(pieces: Sequence[int], length: int) -> list[int]:
    pieces = [int(p) for p in pieces]
    if any(p < 1 for p in pieces) or sum(pieces) != length:
        raise UserInputError(f"schedule pieces {pieces} must be positive and sum to the prompt length {length}")
    return pieces


# ------------------------------------------------------------------------- own family
class CacheEngine:
    """phaseinterp's own `CompressedTransformer`: ``schedule=None`` is the reference full forward
    (no cache); otherwise the prompt goes through ``model.init_cache()`` in the schedule's pieces
    (``model(piece, cache=cache)``). Log-probs are computed in float32."""

    def __init__(self, model: torch.nn.Module, schedule: Optional[Schedule] = None, name: str = "reference"):
        if phase_model(model).family != "compressed":
            raise UserInputError(f"CacheEngine needs phaseinterp's own CompressedTransformer (its init_cache()), got "
                                f"{type(model).__name__}")
        self.model, self.schedule, self.name = model, schedule, name

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def __call__(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_vocab"]:
        tokens = tokens.to(self.device)
        if self.schedule is None:
            return _last_logprobs(self.model(tokens))
        refuse_hooks(self.model, f"CacheEngine {self.name!r} (prompts in cached pieces)")
        cache, pos, logits = self.model.init_cache(), 0, None
        for n in _check_pieces(self.schedule(tokens.shape[1]), tokens.shape[1]):
            logits = self.model(tokens[:, pos:pos + n], cache=cache)
            pos += n
        return _last_logprobs(logits)

    @torch.inference_mode()
    def warm(self, donors: Int[Tensor, "batch pos"], tokens: Int[Tensor, "batch pos"],
             prefix_len: int) -> Float[Tensor, "batch d_vocab"]:
        """``tokens`` answered from the cache the donors left, cut back to ``prefix_len`` tokens
        (`truncate_cache`): the donors go through ``model.init_cache()`` in one piece, then only
        ``tokens[:, prefix_len:]`` are computed (see `WarmEngine`)."""
        check_warm_rows(donors, tokens, prefix_len)
        refuse_hooks(self.model, f"CacheEngine {self.name!r} (a warm cache)")
        cache = self.model.init_cache()
        self.model(donors.to(self.device), cache=cache)
        cache = truncate_cache(self.model, cache, prefix_len)
        return _last_logprobs(self.model(tokens[:, prefix_len:].to(self.device), cache=cache))


def truncate_cache(model: torch.nn.Module, cache: KVCache, length: int) -> KVCache:
    """``cache`` (a `CompressedTransformer`'s) cut back to its first ``length`` tokens, as a prefix
    cache keeps it: per-token inputs ``[:, :length]`` and the compressed entries closed for every KV head
    at ``length`` (the next forward recomputes the rest). The tensors are views of ``cache``'s."""
    if not 0 < length <= cache.length:
        raise UserInputError(f"length={length} is out of range for a cache of {cache.length} tokens "
                             f"(1..{cache.length})")
    layers: list[Optional[LayerCache]] = []
    for block, layer in zip(model.blocks, cache.layers):
        if layer is None:
            layers.append(None)
            continue
        kept = LayerCache(*(t[:, :length] for t in (layer.h, layer.k, layer.v, layer.k_rot)),
                          layer.k_comp, layer.v_comp)
        if model.cfg.is_compressed:
            closed = block.attn._entry_range(length, length)[0]  # the first entry open for some head
            kept.k_comp, kept.v_comp = layer.k_comp[:, :closed], layer.v_comp[:, :closed]
        layers.append(kept)
    return KVCache(layers, length, layout=cache.layout)


# ------------------------------------------------------------------------- transformers
class TransformersEngine:
    """A Hugging Face causal LM (``model.hf`` of a `HookedDeepseekV4`, or any ``*ForCausalLM``): the
    reference adapter. ``schedule=None``: one forward without cache; otherwise ``DynamicCache(config=...)``
    fed in the schedule's pieces with explicit ``position_ids``."""

    def __init__(self, hf_model: torch.nn.Module, schedule: Optional[Schedule] = None, name: str = "reference"):
        # a wrapper (`HookedDeepseekV4`) is kept to refuse its hooks, which transformers' forward never runs
        self.wrapper = hf_model if is_hf_wrapper(hf_model) else None
        hf_model = hf_model.hf if self.wrapper is not None else hf_model
        if not hasattr(hf_model, "config") or not callable(hf_model):
            raise UserInputError(f"TransformersEngine needs a transformers model, got {type(hf_model).__name__}")
        self.hf, self.schedule, self.name = hf_model, schedule, name
        params = inspect.signature(hf_model.forward).parameters
        # transformers 5.x renames past_key_values -> cache for DeepSeek-V4 (the old name warns).
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    @property
    def device(self) -> torch.device:
        return next(self.hf.parameters()).device

    @torch.inference_mode()
    def __call__(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_vocab"]:
        self._refuse_hooks()
        tokens = tokens.to(self.device)
        if self.schedule is None:
            return _last_logprobs(self.hf(input_ids=tokens, use_cache=False).logits)
        cache, pos, logits = DynamicCache(config=self.hf.config), 0, None
        for n in _check_pieces(self.schedule(tokens.shape[1]), tokens.shape[1]):
            logits = self._extend(cache, tokens[:, pos:pos + n], pos)
            pos += n
        return _last_logprobs(logits)

    @torch.inference_mode()
    def warm(self, donors: Int[Tensor, "batch pos"], tokens: Int[Tensor, "batch pos"],
             prefix_len: int) -> Float[Tensor, "batch d_vocab"]:
        """``tokens`` answered from a checkpoint of the cache after the donors' first ``prefix_len``
        tokens (``copy.deepcopy`` of the ``DynamicCache``, its CSA/HCA compressor states included),
        restored after the rest of the donors ran; only ``tokens[:, prefix_len:]`` are computed."""
        check_warm_rows(donors, tokens, prefix_len)
        self._refuse_hooks()
        donors, tokens = donors.to(self.device), tokens.to(self.device)
        cache = DynamicCache(config=self.hf.config)
        self._extend(cache, donors[:, :prefix_len], 0)
        checkpoint = copy.deepcopy(cache)
        self._extend(cache, donors[:, prefix_len:], prefix_len)  # the donor's own continuation, then dropped
        return _last_logprobs(self._extend(checkpoint, tokens[:, prefix_len:], prefix_len))

    def _refuse_hooks(self) -> None:
        if self.wrapper is not None:
            refuse_hooks(self.wrapper, f"TransformersEngine {self.name!r} (transformers' own forward, model.hf)")

    def _extend(self, cache, tokens: Tensor, start: int) -> Tensor:
        """Logits of ``tokens`` at positions ``start..``, ``cache`` extended by them."""
        position_ids = torch.arange(start, start + tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        return self.hf(input_ids=tokens, position_ids=position_ids, use_cache=True, **{self._cache_arg: cache}).logits


def _last_logprobs(logits: Float[Tensor, "batch pos d_vocab"]) -> Float[Tensor, "batch d_vocab"]:
    return torch.log_softmax(logits[:, -1].float(), dim=-1)


def is_hf_wrapper(model: torch.nn.Module) -> bool:
    """A phaseinterp wrapper around a transformers model (``model.hf``)."""
    return hasattr(model, "hf") and hasattr(model.hf, "config")


def engine_for(model: torch.nn.Module, schedule: Optional[Schedule] = None, name: str = "reference"):
    """The in-process engine of ``model``'s family: `CacheEngine` for a `CompressedTransformer`,
    `TransformersEngine` for a `HookedDeepseekV4` (its ``.hf``) or a bare transformers model."""
    family = phase_model(model).family
    if family == "compressed":
        return CacheEngine(model, schedule, name)
    if family == "deepseek_v4":
        return TransformersEngine(model, schedule, name)
    if hasattr(model, "config") and hasattr(model, "generate"):
        return TransformersEngine(model, schedule, name)
    raise UserInputError(f"no in-process engine for {type(model).__name__}: pass a CompressedTransformer, a "
                        "HookedDeepseekV4 (phaseinterp.zoo.load('dsv4-tiny')) or a transformers causal LM")


def cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of ``model`` in ``dtype`` (the original is untouched). For a transformers model the
    modules it lists in ``_keep_in_fp32_modules_strict`` stay float32, as ``from_pretrained(dtype=...)``
    leaves them."""
    hf = model.hf if is_hf_wrapper(model) else model
    keep = tuple(getattr(hf, "_keep_in_fp32_modules_strict", None) or ())
    out = copy.deepcopy(model).to(dtype)
    if keep:
        target = out.hf if is_hf_wrapper(out) else out
        for name, param in target.named_parameters():
            if any(k in name.split(".") for k in keep):
                param.data = param.data.float()
    return out


__all__ = ["CacheEngine", "Engine", "Schedule", "TransformersEngine", "WarmEngine", "cast_copy", "check_warm_rows",
           "chunked_pieces", "decode_pieces", "engine_for", "full_pieces", "is_hf_wrapper", "truncate_cache"]
