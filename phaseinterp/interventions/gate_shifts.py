"""Gate shifts (docs/science.md section 2): the parameters a cyclic shift moves, and context managers
that move them and restore them exactly (even when the body raises). `shift_gates` rolls the
offset-specific gate parameters, ``Z~_i = Z_{(i-d) mod W}``, ``b~_i = b_{(i-d) mod W}`` (DeepSeek kernel:
``position_bias`` within each S-block); `shift_static_gates` moves only the static part of each slot's
mean gate logit; `cycling_fitness` says whether a model is fit for the experiment."""

from __future__ import annotations

import copy
from contextlib import contextmanager, nullcontext
from typing import Iterator, Optional, Sequence, Union

import einops
import numpy as np
import torch
from torch import Tensor

from phaseinterp._checks import check_indices, check_int, check_is_model, check_tensor, listed
from phaseinterp.errors import UserInputError
from phaseinterp.interventions._common import check_layers, model_device
from phaseinterp.models.protocol import phase_model


def shift_targets(model, layers: list[int], branch: str) -> list[tuple[torch.nn.Parameter, int, Optional[int]]]:
    """(parameter, slot axis, KV-head axis or None) triples a shift rolls; raises where a shift
    has no defined meaning. The KV-head axis is None where the layer has one shared KV head (the
    Hugging Face DeepSeek-V4 layout). The model protocol names them (`PhaseModel.gate_targets`)."""
    family = phase_model(model)
    return [(t.parameter, t.slot_axis, t.kv_axis) for layer in layers for t in family.gate_targets(layer, branch)]


def check_shift(shift, model=None, layers=None) -> int:
    """``shift`` as an int: an integer number of slots, and (given ``model``) non-zero mod its stride S,
    the one rule of the experiments, the interventions and the CLI. A model whose layers compress at
    different rates (DeepSeek-V4) is checked against the rates of the shifted ``layers`` (None: every
    compressed layer): the shift is refused when it is 0 mod each of them."""
    if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)):
        raise UserInputError(f"shift={shift!r} must be an integer number of slots")
    shift = int(shift)
    cfg = getattr(model, "cfg", None) if model is not None else None
    S = getattr(cfg, "stride", None)
    if S is None:
        return shift
    if hasattr(cfg, "layer_stride"):
        chosen = (list(getattr(cfg, "compressed_layers", range(cfg.n_layers))) if layers is None
                  else [layers] if isinstance(layers, (int, np.integer)) else list(layers))
        rates = sorted({r for layer in chosen
                        if isinstance(layer, (int, np.integer)) and 0 <= layer < cfg.n_layers
                        for r in [cfg.layer_stride(int(layer))] if r is not None})
        if len(rates) == 1:
            check_nonzero_shift(shift, rates[0])
        elif rates and all(shift % r == 0 for r in rates):
            raise UserInputError(f"shift={shift} is 0 mod every shifted layer's slot count {rates}: it moves nothing")
        return shift
    check_nonzero_shift(shift, S)
    return shift


def check_nonzero_shift(shift: int, S: int) -> None:
    """A UserInputError when ``shift`` is 0 mod S (it moves nothing)."""
    if shift % S == 0:
        raise UserInputError(f"shift={shift} is 0 mod S={S}: it moves nothing (the unshifted model is always "
                             f"measured); use shifts in 1..{S - 1} or their negatives")


def check_kv_heads(model, kv_heads) -> Optional[list[int]]:
    """``None`` (every KV head), one index or a non-empty list of distinct indices in
    ``0..n_kv_heads-1`` (`check_indices`); anything else is a `UserInputError` naming the value."""
    if kv_heads is None:
        return None
    n = model.cfg.n_kv_heads
    return check_indices("kv_heads", kv_heads, 0, n - 1, unit="KV head",
                         why=f" for a model with {n} KV head(s) per layer")


def _rolled(original: Tensor, shift: int, axis: int, kv_axis: Optional[int], kv_heads: Optional[list[int]]) -> Tensor:
    """``original`` rolled by ``shift`` along its slot axis, for the listed KV heads only (all when None)."""
    rolled = torch.roll(original, shifts=shift % max(original.shape[axis], 1), dims=axis)  # any int: its period
    if kv_heads is None or kv_axis is None:
        return rolled
    index = torch.as_tensor(kv_heads, device=original.device)
    return original.index_copy(kv_axis, index, rolled.index_select(kv_axis, index))


@contextmanager
def _parameters_replaced(pairs: list[tuple[torch.nn.Parameter, Tensor]]) -> Iterator:
    """Write each new value into its parameter for the ``with`` block; restore bit-exactly on exit, also on errors."""
    saved = [p.detach().clone() for p, _ in pairs]
    try:
        with torch.no_grad():
            for p, value in pairs:
                p.copy_(value)
        yield
    finally:
        with torch.no_grad():
            for (p, _), original in zip(pairs, saved):
                p.copy_(original)


@contextmanager
def shift_gates(model, shift: int, *, layers: Union[int, Sequence[int], None] = None, branch: str = "both",
                kv_heads: Union[int, Sequence[int], None] = None) -> Iterator:
    """Context manager: inside the ``with`` block the gates of ``layers`` are circularly shifted by
    ``shift`` slots (the intervention behind `gate_cycling_profile` and `gate_cycling_unit`).

    ``Z~_i = Z_{(i-d) mod W}``, ``b~_i = b_{(i-d) mod W}``, ``d = shift`` (any sign; payload maps untouched).
    ``layers``: None (every layer), one index or a list of distinct indices. ``kv_heads``: None (every
    KV head) or the KV heads whose gates move. ``branch``: ``"both"``, ``"k"`` or ``"v"`` (the DeepSeek
    kernel and tied gates allow only "both"). For W = S gated models and the DeepSeek kernel. Restores
    every parameter bit-exactly on exit."""
    check_is_model(model)
    shift = check_shift(shift, model, layers)
    heads = check_kv_heads(model, kv_heads)
    targets = shift_targets(model, check_layers(model, layers), branch)
    pairs = [(p, _rolled(p.detach().clone(), shift, axis, kv_axis, heads)) for p, axis, kv_axis in targets]
    with _parameters_replaced(pairs):
        yield model


def shifted_copy(model, shift: int, *, layers: Union[int, Sequence[int], None] = None, branch: str = "both",
                 kv_heads: Union[int, Sequence[int], None] = None):
    """A deep copy of ``model`` with its gates permanently shifted by ``shift`` slots (the
    original is untouched); ``layers``, ``branch`` and ``kv_heads`` as in `shift_gates`."""
    check_is_model(model)
    shift = check_shift(shift, model, layers)
    twin = copy.deepcopy(model)
    heads = check_kv_heads(twin, kv_heads)
    targets = shift_targets(twin, check_layers(twin, layers), branch)
    with torch.no_grad():
        for p, axis, kv_axis in targets:
            p.copy_(_rolled(p.detach().clone(), shift, axis, kv_axis, heads))
    return twin


# ---------------------------------------------------------------- the static-part shift
def static_targets(model, layers: list[int]) -> list[tuple[int, str, torch.nn.Parameter, str, Optional[int]]]:
    """(layer, gate-logit hook, bias parameter, layout, KV-head axis) for the static-part shift.

    Layouts map the per-slot mean logit ``[slot, kv_head(, d_head)]`` onto the bias: ``"slot"`` (``b``
    ``[W, kv_head(, d_head)]``), ``"own_deepseek"`` (``position_bias`` ``[S, half, kv_head, d_head]``, slot =
    half * S + i) and ``"hf"`` (``position_bias`` ``[S, half * d_head]``, one KV head)."""
    family = phase_model(model)
    shift_targets(model, layers, "both")  # the same validity rules as the roll
    out = []
    for layer in layers:
        biases = [t for t in family.gate_targets(layer, "both") if t.layout != "slot_weight"]
        if not biases:
            raise UserInputError("mode='static' shifts the gate bias; this model has gate_bias=False (no b_i to "
                             "move): use mode='roll'")
        out += [(layer, t.hook, t.parameter, t.layout, t.kv_axis) for t in biases]
    return out


@torch.inference_mode()
def mean_gate_logits(model, tokens: Tensor, *, layers: Union[int, Sequence[int], None] = None,
                     batch_size: int = 64) -> dict[str, Tensor]:
    """Per slot, the mean gate logit over every closed window of ``tokens`` ``[batch, pos]``: the
    prompt-independent part of each slot's gate. Returns ``{hook name: [slot, kv_head(, d_head)]}`` per
    gate-logit hook of ``layers`` (entries with logit -inf are left out of the mean)."""
    check_is_model(model)

    batch_size = check_int("batch_size", batch_size, 1)
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype not in (torch.int32, torch.int64):
        raise UserInputError(f"tokens={type(tokens).__name__} must be integer token ids [batch, pos]")
    targets = static_targets(model, check_layers(model, layers))
    names = sorted({t[1] for t in targets})
    sums: dict[str, Tensor] = {}
    counts: dict[str, Tensor] = {}
    device = model_device(model)
    for i in range(0, tokens.shape[0], batch_size):
        _, cache = model.run_with_cache(tokens[i: i + batch_size].to(device), names_filter=names, return_type=None,
                                        return_cache_object=False)
        for name in names:
            x = cache[name].float().flatten(0, 1)  # [batch * entry, slot, ...]
            ok = torch.isfinite(x)
            sums[name] = sums.get(name, 0) + torch.where(ok, x, torch.zeros_like(x)).sum(0)
            counts[name] = counts.get(name, 0) + ok.sum(0)
    return {name: sums[name] / counts[name].clamp(min=1) for name in names}


def _static_delta(mean_logit: Tensor, shift: int, layout: str, bias: Tensor) -> Tensor:
    """``roll(mu, d) - mu`` per slot, laid out like ``bias`` (the shift moves within each S-block)."""
    S = bias.shape[0]
    if layout == "slot":
        mu = mean_logit
    elif layout == "own_deepseek":
        mu = einops.rearrange(mean_logit, "(half s) k d -> s half k d", s=S)
    else:
        mu = einops.rearrange(mean_logit, "(half s) 1 d -> s (half d)", s=S)
    mu = mu.to(bias.dtype).to(bias.device)
    return torch.roll(mu, shifts=shift % max(mu.shape[0], 1), dims=0) - mu


@contextmanager
def shift_static_gates(model, shift: int, *, layers: Union[int, Sequence[int], None],
                       mean_logits: dict[str, Tensor], kv_heads: Union[int, Sequence[int], None] = None) -> Iterator:
    """Context manager: shift only the prompt-independent part of each slot's gate logit.

    With ``mu_i`` the mean gate logit of slot ``i`` (`mean_gate_logits`), the bias becomes ``b~_i = b_i +
    mu_{(i-d) mod W} - mu_i``: each slot's mean preference moves by ``d`` slots while ``Z_i h - E[Z_i h]``
    stays. ``kv_heads`` as in `shift_gates`. Restores every parameter bit-exactly on exit."""
    check_is_model(model)
    shift = check_shift(shift, model, layers)
    heads = check_kv_heads(model, kv_heads)
    pairs = []
    if not isinstance(mean_logits, dict):
        raise UserInputError(f"mean_logits={type(mean_logits).__name__} must be the dict mean_gate_logits(model, tokens) "
                             "returns")
    for layer, name, bias, layout, kv_axis in static_targets(model, check_layers(model, layers)):
        if name not in mean_logits:
            raise UserInputError(f"mean_logits has no entry for {name!r}: compute it with mean_gate_logits(model, "
                             f"tokens, layers={layer})")
        mu = mean_logits[name]
        check_tensor(f"mean_logits[{name!r}]", mu, tuple(getattr(mu, "shape", ("slot", "kv_head"))))
        try:
            delta = _static_delta(mu, shift, layout, bias)
        except einops.EinopsError:
            delta = None
        if delta is None or delta.shape != bias.shape:  # a mean of another model would broadcast silently
            raise UserInputError(f"mean_logits[{name!r}] has shape {list(mu.shape)}, which does not fit this layer's "
                                 f"gate bias {list(bias.shape)}: compute it with mean_gate_logits(model, tokens, "
                                 f"layers={layer}) of this model")
        if heads is not None and kv_axis is not None:
            keep = torch.zeros(bias.shape[kv_axis], dtype=torch.bool, device=bias.device)
            keep[heads] = True
            shape = [1] * bias.ndim
            shape[kv_axis] = -1
            delta = delta * keep.reshape(shape).to(delta.dtype)
        pairs.append((bias, bias.detach() + delta))
    with _parameters_replaced(pairs):
        yield model


def gate_shift(model, shift: int, mode: str, layers: list[int], kv_heads: Optional[list[int]], branch: str = "both",
               mean_logits: Optional[dict[str, Tensor]] = None):
    """The context of the model with its gates shifted by ``shift``: `shift_static_gates` (``mode="static"``)
    or `shift_gates`; the model unchanged at shift 0."""
    if shift == 0:
        return nullcontext(model)
    if mode == "static":
        return shift_static_gates(model, shift, layers=layers, mean_logits=mean_logits, kv_heads=kv_heads)
    return shift_gates(model, shift, layers=layers, branch=branch, kv_heads=kv_heads)


def cycling_fitness(model) -> tuple[bool, str]:
    """Whether gate cycling is a meaningful experiment on ``model``, and why (one sentence): the
    model family's answer (`PhaseModel.cycling_fitness`). It needs offset-specific gate parameters
    AND payloads shared across slots; a run without them is a negative control, to be labelled as
    one (docs/science.md, "Gate cycling")."""
    return phase_model(model).cycling_fitness()


# ---------------------------------------------------------------- the scores (statistics: cycling_stats)
def canonical_shifts(shifts: Sequence[int], period: int) -> tuple[int, ...]:
    """Distinct nonzero shifts mod ``period``, each as its representative in (-period/2, period/2], sorted.

    With W = S, rolling the gates by ``d`` and by ``d - S`` is one intervention: counting both
    would score every observation twice."""
    out = set()
    for d in shifts:
        d = check_shift(d) % period
        if d:
            out.add(d - period if d > period // 2 else d)
    return tuple(sorted(out))


def check_shifts(shifts, S: int) -> tuple[int, ...]:
    """``(0, *requested)``: the unshifted model first, then each requested shift once (validated)."""
    if shifts is None:
        shifts = canonical_shifts(range(1, S), S)
    if not isinstance(listed(shifts), list):
        raise UserInputError(f"shifts={shifts!r} must be a list of non-zero integer shifts")
    shifts = listed(shifts)
    requested = [check_shift(d) for d in shifts]
    if not requested:
        raise UserInputError(f"shifts={list(shifts)!r} is empty; pass at least one shift in 1..{S - 1} (mod S={S})")
    for d in requested:
        check_nonzero_shift(d, S)
    return tuple(dict.fromkeys([0] + requested))


