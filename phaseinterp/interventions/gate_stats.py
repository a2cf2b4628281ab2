"""Gate statistics: ``E[alpha]`` per layer x KV head x branch x slot over a task's windows, its
concentration (effective number of slots: static ``exp(H(E[alpha]))``, per window ``E[exp(H(alpha))]``),
the static gate (``softmax(b)`` or DeepSeek's ``position_bias``), and its alignment with the knockouts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, no_type_check

import numpy as np
import pandas as pd
import torch

from phaseinterp.errors import UserInputError, applies_only, when_given
from phaseinterp._checks import (MAX_PROMPTS, GateProfileOptions, check_int, check_is_model, check_n_per_residue,
                                 check_prompt_batch, experiment)
from phaseinterp.models.protocol import phase_model
from phaseinterp.interventions._common import model_device
from phaseinterp.results import Result, plotting, premise_entries
from phaseinterp.tasks import resolve_task
from phaseinterp.models.protocol import model_label as label_of


def _entropy_exp(p, axis: int):
    p = np.clip(p, 1e-30, None)
    return np.exp(-(p * np.log(p)).sum(axis=axis))


@dataclass(frozen=True, eq=False, repr=False)
class GateProfile(Result):
    """`gate_profile`'s result: one row per (layer, kv_head, branch, slot) in ``slots``, one row per
    (layer, kv_head, branch) in ``heads``. ``mean_alpha`` and ``static_alpha`` are gate weights (summing to 1
    over a window); concentrations are effective numbers of slots, 1 (one-hot) to W (uniform)."""

    slots: pd.DataFrame  # layer, kv_head, branch, slot, phase, mean_alpha, static_alpha
    heads: pd.DataFrame  # layer, kv_head, branch, preferred_slot, static_concentration, window_concentration, ...
    window: int
    stride: int
    model_label: str = ""

    @property
    def premise_notes(self) -> tuple[str, ...]:
        """The premise of a preferred slot that fails: some gate concentrates (an effective number
        of slots below W); with every gate uniform the preferred slot is an arbitrary tie."""
        notes = list(super().premise_notes)
        conc = self.heads["window_concentration"].to_numpy(dtype=float) if len(self.heads) else np.zeros(0)
        if conc.size and np.all(conc >= self.window * (1 - 1e-3)):
            notes.append(f"every gate is uniform (effective number of slots {self.window} of {self.window}): no slot "
                         "is preferred, so preferred_slot is an arbitrary tie")
        return tuple(notes)

    def mean_alpha(self, branch: str = "k") -> np.ndarray:
        """``[layer, kv_head, slot]`` E[alpha] of one branch."""
        sub = self.slots[self.slots.branch == branch]
        layers, heads = sub.layer.max() + 1, sub.kv_head.max() + 1
        return sub.sort_values(["layer", "kv_head", "slot"]).mean_alpha.to_numpy().reshape(layers, heads, self.window)

    def alignment(self, ablation, branch: str = "k") -> pd.DataFrame:
        """Per (layer, kv_head): Pearson correlation across phases between the gate preference (E[alpha]
        folded to phases) and the knockout harm (``-relative change``, clipped at 0), and whether the
        preferred phase is among the most hurt. ``correlation`` uses the mean gate E[softmax(Z h + b)],
        ``static_correlation`` the static part ``softmax(b)``. Each rests on S points; for a held-out test
        use `phaseinterp.interventions.confirm`."""
        rel = ablation.relative_change
        rows = []
        for (layer, kv), harm_row in rel.iterrows():
            if kv < 0:
                continue
            sub = self.slots[(self.slots.layer == layer) & (self.slots.kv_head == kv) & (self.slots.branch == branch)]
            if sub.empty:
                continue
            pref = sub.groupby("phase").mean_alpha.sum().reindex(range(self.stride), fill_value=0).to_numpy()
            static = sub.groupby("phase").static_alpha.sum().reindex(range(self.stride), fill_value=0).to_numpy()
            harm = np.clip(-np.nan_to_num(harm_row.to_numpy(dtype=float)), 0, None)
            corr = float(np.corrcoef(pref, harm)[0, 1]) if pref.std() > 0 and harm.std() > 0 else np.nan
            corr_static = float(np.corrcoef(static, harm)[0, 1]) if static.std() > 0 and harm.std() > 0 else np.nan
            top = set(np.argsort(-harm)[: max(1, self.stride // 4)]) if harm.max() > 0 else set()
            rows.append(dict(layer=int(layer), kv_head=int(kv), preferred_phase=int(pref.argmax()),
                             worst_knockout_phase=int(harm.argmax()) if harm.max() > 0 else -1,
                             correlation=corr, static_correlation=corr_static,
                             preferred_in_hurt=int(pref.argmax()) in top, max_harm=float(harm.max())))
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, kv_head, branch, slot): ``mean_alpha`` over windows and ``static_alpha``."""
        return self.slots.copy()

    def to_dict(self) -> dict:
        """Headline numbers: window, stride, and per (layer, KV head, branch) the preferred slot and
        the per-window concentration (effective number of slots); ``premise`` / ``premise_notes``."""
        out = {"model": self.model_label, "window": self.window, "stride": self.stride}
        for r in self.heads.itertuples():
            out[f"L{r.layer} KV{r.kv_head} {r.branch}"] = (
                f"slot {r.preferred_slot}, concentration {r.window_concentration:.2f} of {self.window}")
        return out | premise_entries(self.premise_notes)

    def plot(self, **kwargs):
        return plotting().gate_profile_figure(self, **kwargs)


@no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
class GateProfileSpec(GateProfileOptions):
    """`gate_profile`'s options, checked when made; their meanings are its parameters."""

    def validate(self) -> None:
        check_int("n_per_residue", self.n_per_residue, 1, MAX_PROMPTS)  # seed, batch_size: GateProfileOptions

    def check_model(self, model) -> None:
        """A compressed model: the full-attention twin has no gates."""
        if not model.cfg.is_compressed:
            raise UserInputError("gate_profile: the full-attention model (compression=None) has no gates")

    def check_task(self, task) -> None:
        """At most 500,000 prompts; no moment matching is needed (the statistics average over windows)."""
        check_n_per_residue(self.n_per_residue, task.residue_modulus)


@torch.inference_mode()
@applies_only(("n_per_residue",), unless=when_given("prompts", "prompts= gives the prompts, so their count is fixed"))
@experiment(GateProfileSpec)
def gate_profile(model, task=None, *, n_per_residue: int = 8, seed: int = 0, batch_size: int = 64,
                 prompts=None, spec: Optional[GateProfileSpec] = None) -> GateProfile:
    """Gate statistics of every layer, KV head and branch over the task's windows.

    ``model``: a compressed model; ``task``: default the stored one; ``n_per_residue`` (no moment matching
    needed: any size >= 1, at most 500,000 prompts); ``prompts``: a pre-generated batch (then
    ``n_per_residue`` does not apply); ``spec``: a ready `GateProfileSpec` (not both). Returns a `GateProfile`."""
    check_is_model(model)
    spec.check_model(model)
    cfg = model.cfg
    family = phase_model(model)
    task = resolve_task(model, task)
    if prompts is None:
        spec.check_task(task)
    else:
        spec.refuse_changed(("n_per_residue",), "prompts= gives the prompts, so their count is fixed")
        check_prompt_batch(prompts, every_residue=False)  # statistics over windows: any residues will do
    batch_size = spec.batch_size
    # Gate statistics average over windows, not over targets: no moment matching needed.
    batch = prompts if prompts is not None else task.generate(spec.n_per_residue, seed=spec.seed, strict=False)
    W, S = cfg.window, family.stride
    layers = family.compressed_layers  # an uncompressed layer (sliding-window-only) has no gates
    # one hook per gate: where K and V share one (DeepSeek kernels, tied gates), both branches read it
    hook_of = {(layer, br): family.gate_hook(layer, br) for layer in layers for br in ("k", "v")}
    names = sorted(set(hook_of.values()))
    sums = {n: 0.0 for n in names}
    conc = {n: 0.0 for n in names}
    count = {n: 0 for n in names}
    device = model_device(model)
    for i in range(0, batch.tokens.shape[0], batch_size):
        _, cache = model.run_with_cache(batch.tokens[i : i + batch_size].to(device), names_filter=names,
                                        return_type=None, return_cache_object=False)
        for n in names:
            alpha = cache[n].double()  # [b, win, slot, kv(, d)]
            if alpha.ndim == 4:
                alpha = alpha.unsqueeze(-1)  # scalar gates: one "channel"
            a = alpha.cpu().numpy()
            sums[n] = sums[n] + a.sum(axis=(0, 1)).mean(-1)  # [slot, kv]
            conc[n] = conc[n] + _entropy_exp(a, axis=2).sum(axis=(0, 1)).mean(-1)  # [kv]
            count[n] += a.shape[0] * a.shape[1]
    slot_rows, head_rows = [], []
    for layer in layers:
        offsets = family.window_offsets(layer)
        for br in ("k", "v"):
            n = hook_of[(layer, br)]
            mean_alpha = sums[n] / count[n]  # [slot, kv]
            window_conc = conc[n] / count[n]
            static = _static_alpha(model, layer, br)  # [slot, kv]
            for kv in family.kv_heads(layer):
                for s in range(W):
                    phase = (s + offsets[kv]) % S  # the head's own window grid
                    slot_rows.append(dict(layer=layer, kv_head=kv, branch=br, slot=s, phase=phase,
                                          mean_alpha=float(mean_alpha[s, kv]), static_alpha=float(static[s, kv])))
                head_rows.append(dict(
                    layer=layer, kv_head=kv, branch=br, preferred_slot=int(mean_alpha[:, kv].argmax()),
                    static_preferred_slot=int(static[:, kv].argmax()),
                    static_concentration=float(_entropy_exp(mean_alpha[:, kv], 0)),
                    window_concentration=float(window_conc[kv]),
                    bias_concentration=float(_entropy_exp(static[:, kv], 0)),
                ))
    return GateProfile(slots=pd.DataFrame(slot_rows), heads=pd.DataFrame(head_rows), window=W, stride=S,
                       model_label=label_of(model))


def _static_alpha(model, layer: int, branch: str) -> np.ndarray:
    """softmax over slots of the h-independent gate part (b, or position_bias), ``[slot, kv]``;
    channel-wise gates are averaged over channels after the softmax."""
    cfg = model.cfg
    gp = model.gate_parameters(layer, branch)
    if gp.b is None:  # uniform gates: alpha = 1/W whatever h is
        return np.full((cfg.window, cfg.n_kv_heads), 1.0 / cfg.window)
    b = gp.b.detach().double().cpu()
    alpha = b.softmax(0)
    if alpha.ndim == 3:
        alpha = alpha.mean(-1)
    return alpha.numpy()
