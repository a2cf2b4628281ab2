"""The confirmatory pipeline: `confirm(model)` tests the mechanism claims on disjoint prompt splits
(evaluation, calibration, nomination):

1. per-KV-head **mean replacement** and two alternative ablations of ``hook_z`` at the answer position
   (**resample**, **norm-matched mean**), each tested per unit x phase (`AblationResult.phase_tests`),
   and their **agreement**;
2. **held-out confirmation of gate-nominated heads**: `gate_profile` on the nomination split names each
   concentrated unit's preferred phase; the evaluation split's knockout says whether it hurts there,
   against random (unit, phase) nominations;
3. **gate cycling** where it is meaningful (`cycling_fitness`), scored by `cycling_scores`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union, no_type_check

import numpy as np
import pandas as pd
import torch
from scipy import stats as scipy_stats

from phaseinterp._checks import (DEFAULT_N_PER_RESIDUE, MAX_PROMPTS, Spec, check_fraction, check_int, check_seed,
                                 check_is_model, check_n_per_residue, check_prompt_batch, check_real, experiment)
from phaseinterp.errors import UserInputError, applies_only, when_given
from phaseinterp._files import progress_bar
from phaseinterp.interventions._common import (check_calibrated_sweep, check_calibration_size, check_layers,
                                               fixed_answer_position, model_device, phase_model_note)
from phaseinterp.interventions.ablation import AblationResult, _units, ablate
from phaseinterp.interventions.gate_cycling import gate_cycling_profile
from phaseinterp.interventions.gate_shifts import cycling_fitness
from phaseinterp.interventions.gate_stats import gate_profile
from phaseinterp.results import Result, plotting, premise_entries
from phaseinterp.tasks import resolve_task
from phaseinterp.models.protocol import model_label as label_of, phase_model

ABLATIONS = ("mean", "resample", "norm_matched")


# --------------------------------------------------------------- ablations
@torch.inference_mode()
def _answer_z(model, tokens: torch.Tensor, answer_pos: int, batch_size: int) -> torch.Tensor:
    """``hook_z`` at ``answer_pos`` of every prompt: ``[prompt, layer, head, d_head]``."""
    family = phase_model(model)
    names = [family.z_hook(layer) for layer in range(family.n_layers)]
    out = []
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i : i + batch_size, : answer_pos + 1].to(model_device(model))
        _, cache = model.run_with_cache(chunk, names_filter=names, return_type=None, return_cache_object=False)
        out.append(torch.stack([cache[n][:, answer_pos] for n in names], 1).cpu())
    return torch.cat(out)


@no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
@dataclass(frozen=True)
class ReplacementSpec(Spec):
    """`replacement_ablation`'s options, checked when made; their meanings are its parameters."""

    method: str = "resample"
    layer: Union[int, Sequence[int], None] = None
    n_per_residue: int = DEFAULT_N_PER_RESIDUE
    n_calibration: int = 256
    seed: int = 0
    calibration_seed: int = 1
    batch_size: int = 64
    progress: bool = False

    def validate(self) -> None:
        if self.method not in ABLATIONS:
            raise UserInputError(f"method={self.method!r} is not one of {ABLATIONS}")
        check_calibrated_sweep(self)

    def check_model(self, model) -> None:
        """Layer indices in range."""
        check_layers(model, self.layer)

    def check_task(self, task) -> None:
        """The prompt count and a calibration set over every residue (``n_calibration >= R``)."""
        check_n_per_residue(self.n_per_residue, task.residue_modulus)
        check_calibration_size(self.n_calibration, task.residue_modulus)


@torch.inference_mode()
@applies_only(("n_per_residue",), unless=when_given("prompts", "prompts= gives the prompts, so their count is fixed"))
@experiment(ReplacementSpec)
def replacement_ablation(model, task=None, *, method: str = "resample", layer=None, n_per_residue: int = DEFAULT_N_PER_RESIDUE,
                         n_calibration: int = 256, seed: int = 0, calibration_seed: int = 1,
                         batch_size: int = 64, prompts=None, progress: bool = False,
                         spec: Optional[ReplacementSpec] = None):
    """Per-KV-head ablation of ``hook_z`` at the answer position with another replacement than the mean.

    ``method="resample"``: each prompt's z is replaced by the z of a random calibration prompt (seeded).
    ``method="norm_matched"``: by the calibration mean rescaled per prompt and head to the norm of the z
    it replaces, ``z' = mean_z * |z| / |mean_z|``. ``method="mean"`` is `ablate`. Options as `ablate`'s;
    ``spec`` a ready `ReplacementSpec` (not both). Returns an `AblationResult` (one hooked forward per unit)."""
    if prompts is not None:
        spec.refuse_changed(("n_per_residue",), "prompts= gives the prompts, so their count is fixed")
    if spec.method == "mean":
        size = {} if prompts is not None else {"n_per_residue": spec.n_per_residue}
        return ablate(model, task, layer=spec.layer, n_calibration=spec.n_calibration, seed=spec.seed,
                      calibration_seed=spec.calibration_seed, batch_size=spec.batch_size, prompts=prompts,
                      progress=spec.progress, **size)

    if getattr(model, "training", False):
        raise UserInputError("replacement_ablation needs the model in eval mode; call model.eval() first")
    layers = check_layers(model, spec.layer)  # spec.check_model's check, keeping the normalized layers
    task = resolve_task(model, task)
    if prompts is None:
        spec.check_task(task)
    else:
        check_prompt_batch(prompts)
        check_calibration_size(spec.n_calibration, task.residue_modulus)
    method, batch_size, progress = spec.method, spec.batch_size, spec.progress
    units = _units(model, layers, "kv_head", None)
    batch = prompts if prompts is not None else task.generate(spec.n_per_residue, seed=spec.seed)
    answer_pos = fixed_answer_position(batch)
    calib = task.calibration(spec.n_calibration, seed=spec.calibration_seed)
    if fixed_answer_position(calib) != answer_pos:
        raise UserInputError("calibration prompts must share the evaluation prompts' answer position")
    calib_z = _answer_z(model, calib.tokens, answer_pos, batch_size)  # [cal, layer, head, d]
    mean_z = calib_z.mean(0)
    n = batch.tokens.shape[0]
    donors = torch.as_tensor(np.random.default_rng(spec.seed).integers(0, calib_z.shape[0], n))
    device = model_device(model)
    answer = torch.as_tensor(batch.answer)
    clean_ok = np.zeros(n, dtype=bool)
    ko_ok = np.zeros((n, len(units)), dtype=bool)
    bar = progress_bar(progress, n * len(units), f"ablate ({method})")
    try:
        for i in range(0, n, batch_size):
            chunk = batch.tokens[i : i + batch_size, : answer_pos + 1].to(device)
            ans = answer[i : i + batch_size].to(device)
            clean_ok[i : i + len(ans)] = (model(chunk)[:, answer_pos].argmax(-1) == ans).cpu().numpy()
            donor_z = calib_z[donors[i : i + batch_size]].to(device)  # [b, layer, head, d]
            for u, unit in enumerate(units.itertuples()):
                heads = list(unit.heads)

                def replace(z, hook, layer=unit.layer, heads=heads, donor_z=donor_z):
                    z = z.clone()
                    if method == "resample":
                        z[:, answer_pos, heads] = donor_z[:, layer, heads].to(z.dtype)
                    else:
                        original = z[:, answer_pos, heads]  # [b, h, d]
                        mean = mean_z[layer, heads].to(z.device, z.dtype)  # [h, d]
                        scale = original.norm(dim=-1, keepdim=True) / mean.norm(dim=-1, keepdim=True).clamp_min(1e-12)
                        z[:, answer_pos, heads] = mean * scale
                    return z

                logits = model.run_with_hooks(chunk, fwd_hooks=[(phase_model(model).z_hook(unit.layer), replace)])
                ko_ok[i : i + len(ans), u] = (logits[:, answer_pos].argmax(-1) == ans).cpu().numpy()
                if bar is not None:
                    bar.update(len(ans))
    finally:
        if bar is not None:
            bar.close()
    return AblationResult(units=units, residue=np.asarray(batch.meta["residue"].to_numpy(), dtype=np.int64),
                          clean_correct=clean_ok, knockout_correct=ko_ok, residue_modulus=task.residue_modulus,
                          stride=model.cfg.stride, scope="kv_head", model_label=label_of(model),
                          n_calibration=spec.n_calibration,
                          premise_recorded=tuple(n for n in [phase_model_note(model, "replacement_ablation")] if n))


def ablation_agreement(results: dict, correction: str = "holm", alpha: float = 0.05) -> pd.DataFrame:
    """Pairwise agreement of ablation methods on the same prompts and units: Pearson correlation of
    their unit x phase changes (pp), the share of unit x phase cells where their significance
    calls (``phase_tests``) agree, and whether they name the same specialized units and phases."""
    names = list(results)
    tests = {m: results[m].phase_tests(correction, alpha) for m in names}
    spec = {m: results[m].specialization(correction=correction, alpha=alpha) for m in names}
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pa, pb = tests[a].change_pp.to_numpy(), tests[b].change_pp.to_numpy()
            ok = np.isfinite(pa) & np.isfinite(pb)
            corr = float(np.corrcoef(pa[ok], pb[ok])[0, 1]) if ok.sum() > 2 and pa[ok].std() > 0 and pb[ok].std() > 0 \
                else float("nan")
            calls_a, calls_b = tests[a].significant.to_numpy(), tests[b].significant.to_numpy()
            same_units = [list(x) for x in spec[a].phases] == [list(x) for x in spec[b].phases]
            rows.append(dict(method_a=a, method_b=b, correlation_pp=corr,
                             significance_agreement=float(np.mean(calls_a == calls_b)),
                             both_significant=int(np.sum(calls_a & calls_b)),
                             only_a=int(np.sum(calls_a & ~calls_b)), only_b=int(np.sum(~calls_a & calls_b)),
                             same_specialization=bool(same_units),
                             max_abs_difference_pp=float(np.nanmax(np.abs(pa - pb))) if ok.any() else float("nan")))
    return pd.DataFrame(rows)


# ------------------------------------------------------------- nomination
def _poisson_binomial_tail(probabilities: np.ndarray, k: int) -> float:
    """P(X >= k) for a sum of independent Bernoulli(p_i)."""
    dist = np.array([1.0])
    for p in probabilities:
        dist = np.convolve(dist, [1 - p, p])
    return float(dist[k:].sum()) if k < len(dist) else 0.0


def check_max_concentration(value) -> float:
    """``max_concentration`` as a Python float >= 1 (an effective number of slots); else a `UserInputError`."""
    return check_real("max_concentration", value, 1.0,
                      why=" or None (W/2): an effective number of slots, 1 = one-hot .. W = uniform")


def nominate_heads(gates, max_concentration: Optional[float] = None, branch: str = "k") -> pd.DataFrame:
    """Gate-nominated (unit, phase) claims from a `GateProfile`: for every (layer, KV head) whose
    gate is concentrated (effective number of slots ``exp(H(E[alpha])) <= max_concentration``,
    default W/2), the phase its E[alpha] prefers (slots folded to phases). The claim to confirm
    elsewhere: knocking the unit out hurts that phase."""
    limit = gates.window / 2 if max_concentration is None else check_max_concentration(max_concentration)
    heads = gates.heads[gates.heads.branch == branch]
    slots = gates.slots[gates.slots.branch == branch]
    rows = []
    for h in heads.itertuples():
        sub = slots[(slots.layer == h.layer) & (slots.kv_head == h.kv_head)]
        by_phase = sub.groupby("phase").mean_alpha.sum().reindex(range(gates.stride), fill_value=0.0)
        rows.append(dict(layer=int(h.layer), kv_head=int(h.kv_head), preferred_phase=int(by_phase.to_numpy().argmax()),
                         preferred_alpha=float(by_phase.max()), concentration=float(h.static_concentration),
                         nominated=bool(h.static_concentration <= limit)))
    return pd.DataFrame(rows)


def confirm_nominations(nominations: pd.DataFrame, ablation, correction: str = "holm",
                        alpha: float = 0.05) -> tuple[pd.DataFrame, dict]:
    """Score gate nominations against an ablation on a DISJOINT split.

    A nominated (unit, phase) is a *hit* when the unit's knockout lowers that phase's accuracy
    significantly (``phase_tests``, ``correction`` over all units x phases). ``p_value``: the
    hypergeometric chance that as many random cells hit at least as often; ``p_same_units``: the same
    units with a uniformly random phase each (exact Poisson-binomial)."""
    tests = ablation.phase_tests(correction, alpha)
    hurt = tests.assign(hurt=tests.significant & (tests.change_pp < 0)).set_index(["layer", "kv_head", "phase"])
    table = nominations.copy()
    table["hit"] = [bool(hurt.loc[(r.layer, r.kv_head, r.preferred_phase), "hurt"]) for r in table.itertuples()]
    table["change_pp"] = [float(hurt.loc[(r.layer, r.kv_head, r.preferred_phase), "change_pp"])
                          for r in table.itertuples()]
    table["p_adjusted"] = [float(hurt.loc[(r.layer, r.kv_head, r.preferred_phase), "p_adjusted"])
                           for r in table.itertuples()]
    chosen = table[table.nominated]
    k, hits = len(chosen), int(chosen.hit.sum())
    cells, hit_cells = len(hurt), int(hurt.hurt.sum())
    per_unit = hurt.hurt.groupby(level=["layer", "kv_head"]).mean()
    p_unit = np.array([per_unit.loc[(r.layer, r.kv_head)] for r in chosen.itertuples()])
    stats = dict(
        n_nominated=k, n_hits=hits, hit_rate=hits / k if k else float("nan"),
        chance_rate=hit_cells / cells if cells else float("nan"),
        p_value=float(scipy_stats.hypergeom.sf(hits - 1, cells, hit_cells, k)) if k else float("nan"),
        chance_rate_same_units=float(p_unit.mean()) if k else float("nan"),
        p_same_units=_poisson_binomial_tail(p_unit, hits) if k else float("nan"),
    )
    return table, stats


def _row_keys(tokens: torch.Tensor) -> set:
    return {bytes(row) for row in tokens.cpu().numpy().astype(np.int64)}


# ----------------------------------------------------------------- result
@dataclass(frozen=True, eq=False, repr=False)
class ConfirmResult(Result):
    """`confirm`'s result: every confirmatory test on one model, as tables.

    ``ablation_tests`` (`AblationResult.phase_tests` rows per ablation ``method``), ``specialization``,
    ``agreement`` (`ablation_agreement`), ``nominations`` (`confirm_nominations`), ``cycling``
    (`cycling_scores`' per-shift table; empty with ``cycling_note`` saying why). Scalars: the nomination
    hit rate, its chance rates and p-values, and the cycling headline numbers."""

    model_label: str
    stride: int
    phase_accuracy: np.ndarray  # clean accuracy per phase on the evaluation split
    ablation_tests: pd.DataFrame
    specialization: pd.DataFrame
    agreement: pd.DataFrame
    nominations: pd.DataFrame
    cycling: pd.DataFrame
    n_nominated: int = 0
    n_hits: int = 0
    hit_rate: float = float("nan")
    chance_rate: float = float("nan")
    nomination_p: float = float("nan")
    chance_rate_same_units: float = float("nan")
    nomination_p_same_units: float = float("nan")
    cycling_note: str = ""
    cycling_r2_pooled: float = float("nan")
    cycling_corr2_pooled: float = float("nan")
    cycling_identified: str = ""
    cycling_identification_p: float = float("nan")
    correction: str = "holm"
    alpha: float = 0.05
    n_prompts: int = 0
    seeds: tuple = (0, 1, 2)
    premise_recorded: tuple[str, ...] = ()  # the mean ablation's and the gate cycling's failed premises

    def to_dict(self) -> dict:
        """Headline numbers: clean phase accuracies, units each ablation finds specialized, how the
        ablations agree, the nomination hit rate against chance, the gate-cycling scores
        (``cycling_identified`` says "not claimed" when the cycling's premise fails), and
        ``premise`` / ``premise_notes`` (the mean ablation's and the gate cycling's)."""
        spec = {m: [f"L{r.layer}H{r.kv_head}: {list(r.hurt_phases)}" for r in grp.itertuples() if len(r.hurt_phases)]
                for m, grp in self.specialization.groupby("method", sort=False)}
        agree = {f"{r.method_a} vs {r.method_b}": f"r={r.correlation_pp:.3f}, calls agree {r.significance_agreement:.0%}"
                 for r in self.agreement.itertuples()}
        out = {
            "model": self.model_label, "n_prompts": self.n_prompts,
            "phase_accuracy": [float(a) for a in self.phase_accuracy],
            "test": f"exact paired (McNemar) per unit x phase, {self.correction} over all, alpha {self.alpha}",
            **{f"hurt_phases[{m}]": v for m, v in spec.items()},
            **agree,
            "nominated_confirmed": f"{self.n_hits} of {self.n_nominated}",
            "hit_rate": self.hit_rate, "chance_rate": self.chance_rate, "nomination_p": self.nomination_p,
            "nomination_p_same_units": self.nomination_p_same_units,
        }
        if len(self.cycling):
            out.update(cycling_r2_pooled=self.cycling_r2_pooled, cycling_corr2_pooled=self.cycling_corr2_pooled,
                       cycling_identified=self.cycling_identified,
                       cycling_identification_p=self.cycling_identification_p)
        else:
            out["cycling"] = self.cycling_note or "not run"
        out.update(premise_entries(self.premise_notes))
        return out

    def to_frame(self) -> pd.DataFrame:
        """The unit x phase tests of every ablation method (tidy rows)."""
        return self.ablation_tests.copy()

    def plot(self, **kwargs):
        return plotting().mechanisms.confirm_figure(self, **kwargs)


@no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
@dataclass(frozen=True)
class ConfirmSpec(Spec):
    """`confirm`'s options, checked when made; their meanings are its parameters."""

    n_per_residue: int = DEFAULT_N_PER_RESIDUE
    n_calibration: int = 256
    nominate_per_residue: int = 8
    seed: int = 0
    calibration_seed: int = 1
    nomination_seed: int = 2
    correction: str = "holm"
    alpha: float = 0.05
    max_concentration: Optional[float] = None
    methods: Sequence[str] = ABLATIONS
    cycling: bool = True
    batch_size: int = 64
    progress: bool = True

    def validate(self) -> None:
        if self.correction not in ("holm", "bh"):
            raise UserInputError(f"correction={self.correction!r} is not one of ('holm', 'bh')")
        methods = (self.methods,) if isinstance(self.methods, str) else self.methods
        try:
            methods = tuple(methods)
        except TypeError:
            raise UserInputError(f"methods={self.methods!r} must be a list drawn from {ABLATIONS}") from None
        if "mean" not in methods or any(m not in ABLATIONS for m in methods) or len(set(methods)) < len(methods):
            raise UserInputError(f"methods={self.methods!r} must include 'mean' and be drawn from {ABLATIONS}, "
                                 "each once")
        self._set("methods", methods)
        check_fraction("alpha", self.alpha)
        if self.max_concentration is not None:
            self._set("max_concentration", check_max_concentration(self.max_concentration))
        check_calibrated_sweep(self)
        check_int("nominate_per_residue", self.nominate_per_residue, 1, MAX_PROMPTS)
        check_seed("nomination_seed", self.nomination_seed)
        if self.seed == self.nomination_seed:
            raise UserInputError(f"seed={self.seed} and nomination_seed={self.nomination_seed} must differ "
                                 "(disjoint splits)")

    def check_model(self, model) -> None:
        """A compressed model: the full-attention twin has no gates to nominate or shift."""
        if not model.cfg.is_compressed:
            raise UserInputError("confirm: the full-attention model (compression=None) has no gates to nominate or "
                                 "shift")

    def check_task(self, task) -> None:
        """Each split's size against the task: the evaluation count, a calibration set over every residue
        (``n_calibration >= R``), the nomination count."""
        modulus = task.residue_modulus
        check_n_per_residue(self.n_per_residue, modulus)
        check_calibration_size(self.n_calibration, modulus)
        check_n_per_residue(self.nominate_per_residue, modulus, name="nominate_per_residue")


@applies_only(("n_per_residue",), unless=when_given("prompts", "prompts= gives the prompts, so their count is fixed"))
@experiment(ConfirmSpec)
def confirm(model, task=None, *, n_per_residue: int = DEFAULT_N_PER_RESIDUE, n_calibration: int = 256, nominate_per_residue: int = 8,
            seed: int = 0, calibration_seed: int = 1, nomination_seed: int = 2, correction: str = "holm",
            alpha: float = 0.05, max_concentration: Optional[float] = None, methods=ABLATIONS,
            cycling: bool = True, batch_size: int = 64, progress: bool = True, prompts=None,
            nomination_prompts=None, spec: Optional[ConfirmSpec] = None) -> ConfirmResult:
    """Run the confirmatory pipeline on ``model`` (the module docstring); returns a `ConfirmResult`.

    Splits: evaluation ``task.generate(n_per_residue, seed)``, calibration ``task.calibration(n_calibration,
    calibration_seed)`` and nomination ``task.generate(nominate_per_residue, nomination_seed)``, checked to
    share no prompt. ``correction`` and ``alpha`` govern every unit x phase test; ``max_concentration``
    (default W/2) is the largest effective number of slots a nominating gate may spread over; ``methods``
    the ablations; ``cycling=False`` skips gate cycling. ``prompts`` / ``nomination_prompts``: pre-generated
    batches instead of the sizes. ``spec``: a ready `ConfirmSpec` (not both)."""
    check_is_model(model)
    spec.check_model(model)
    task = resolve_task(model, task)
    if prompts is not None:
        spec.refuse_changed(("n_per_residue",), "prompts= gives the prompts, so their count is fixed")
    if nomination_prompts is not None:
        spec.refuse_changed(("nominate_per_residue",), "nomination_prompts= gives the nomination prompts")
    modulus = task.residue_modulus
    if prompts is None:
        check_n_per_residue(spec.n_per_residue, modulus)
    else:
        check_prompt_batch(prompts)
    check_calibration_size(spec.n_calibration, modulus)
    if nomination_prompts is None:
        check_n_per_residue(spec.nominate_per_residue, modulus, name="nominate_per_residue")
    else:
        check_prompt_batch(nomination_prompts, "nomination_prompts", every_residue=False)
    seed, correction, alpha, methods, batch_size, progress = (spec.seed, spec.correction, spec.alpha, spec.methods,
                                                              spec.batch_size, spec.progress)
    batch = prompts if prompts is not None else task.generate(spec.n_per_residue, seed=seed)
    nomination_batch = (nomination_prompts if nomination_prompts is not None
                        else task.generate(spec.nominate_per_residue, seed=spec.nomination_seed, strict=False))
    if _row_keys(batch.tokens) & _row_keys(nomination_batch.tokens):
        raise UserInputError(f"evaluation (seed={seed}) and nomination (seed={spec.nomination_seed}) prompts overlap")
    results = {}
    for method in methods:
        results[method] = replacement_ablation(model, task, method=method, n_calibration=spec.n_calibration,
                                               seed=seed, calibration_seed=spec.calibration_seed, batch_size=batch_size,
                                               prompts=batch, progress=progress)
    tests = pd.concat([results[m].phase_tests(correction, alpha).assign(method=m) for m in methods], ignore_index=True)
    specialization = pd.concat([results[m].specialization(correction=correction, alpha=alpha).assign(method=m)
                                for m in methods], ignore_index=True)
    specialization["heads"] = specialization["heads"].apply(lambda h: [int(x) for x in h])
    agreement = ablation_agreement(results, correction, alpha)
    gates = gate_profile(model, task, prompts=nomination_batch, batch_size=batch_size)
    nominations, nom = confirm_nominations(nominate_heads(gates, spec.max_concentration), results["mean"],
                                           correction, alpha)
    cyc_table, note = pd.DataFrame(), ""
    cyc_stats: dict = {}
    premise = [f"mean ablation: {n}" for n in results["mean"].premise_notes]
    fit, reason = cycling_fitness(model)
    if not spec.cycling:
        note = "skipped (cycling=False)"
    elif not fit:
        note = f"not run: {reason}"
    else:
        cyc = gate_cycling_profile(model, task, prompts=batch, progress=progress, seed=seed, batch_size=batch_size)
        s = cyc.scores
        cyc_table = s["per_shift"]
        cyc_stats = dict(cycling_r2_pooled=s["r2_pooled"], cycling_corr2_pooled=s["corr2_pooled"],
                         cycling_identified=(f"{s['n_identified']} of {s['n_shifts']}" if cyc.premise_holds
                                             else "not claimed: the premise fails (premise_notes)"),
                         cycling_identification_p=s["identification_p"])
        premise += [f"gate cycling: {n}" for n in cyc.premise_notes]
        note = reason
    clean = results["mean"].clean.reindex(range(model.cfg.stride)).to_numpy(dtype=float)
    return ConfirmResult(
        model_label=label_of(model), stride=model.cfg.stride, phase_accuracy=clean, ablation_tests=tests,
        specialization=specialization, agreement=agreement, nominations=nominations, cycling=cyc_table,
        n_nominated=nom["n_nominated"], n_hits=nom["n_hits"], hit_rate=nom["hit_rate"],
        chance_rate=nom["chance_rate"], nomination_p=nom["p_value"],
        chance_rate_same_units=nom["chance_rate_same_units"], nomination_p_same_units=nom["p_same_units"],
        cycling_note=note, correction=correction, alpha=alpha, n_prompts=int(batch.tokens.shape[0]),
        seeds=(seed, spec.calibration_seed, spec.nomination_seed), premise_recorded=tuple(premise), **cyc_stats,
    )


__all__ = ["ABLATIONS", "ConfirmResult", "ConfirmSpec", "ReplacementSpec", "ablation_agreement", "confirm",
           "confirm_nominations", "nominate_heads", "replacement_ablation"]
