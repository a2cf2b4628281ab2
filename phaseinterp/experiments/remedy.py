"""Staggered compression windows as a remedy for the weak boundary phase.

`compare_remedy` trains twins that differ only in ``window_offsets``: the paper's shared
grid (every KV head compresses windows ``j*S ..``) and a staggered one (KV head ``h`` at
``j*S + o_h``), with the same seeds (initialisation and data), recipe and steps, then
compares when each phase of the shared stride is learned, the per-phase gap along the
way, the final phase profiles, mean accuracy and the measured KV-cache memory per token.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import pandas as pd
import torch

from phaseinterp import stats, zoo
from phaseinterp._checks import DEFAULT_N_PER_RESIDUE, check_int, check_real, check_seed, listed
from phaseinterp._files import atomic_write, check_output_dir, saved_kind
from phaseinterp.config import CompressedConfig
from phaseinterp.errors import UserInputError
from phaseinterp.phase import boundary_phase, n_closed_windows
from phaseinterp.profile import phase_profile
from phaseinterp.results import Result, plotting, premise_entries
from phaseinterp.train import latest_checkpoint, train

VARIANTS = ("baseline", "staggered")
LEARNED = 0.8  # a phase is "learned" at the first evaluation where its probe accuracy reaches this


def _zoo_defaults(window: int, stride: int, architecture: Optional[dict[str, Any]] = None):

    architecture = dict(architecture or {})
    fixed = {"d_vocab", "compression", "window", "stride", "window_offsets"}  # set by the experiment itself
    valid = sorted({f.name for f in dataclasses.fields(CompressedConfig)} - fixed)
    for key in architecture:
        if key not in valid:
            raise UserInputError(f"architecture key {key!r} is not a CompressedConfig setting the twins may change "
                                f"(valid: {', '.join(valid)})")
    compression = dict(compression="gated", window=window, stride=stride, gate="scalar")
    for key in ("gate", "payload"):  # compression options; the rest are backbone overrides
        if key in architecture:
            compression[key] = architecture.pop(key)
    entry = zoo.ZooEntry("remedy", "", compression, backbone=architecture)
    return entry.task_object(), entry.model_config, entry.train_config()


def twin_run(
    variant: str,
    seed: int,
    out_dir: Union[str, Path],
    *,
    offsets: Any = "staggered",
    window: int = 4,
    stride: int = 4,
    architecture: Optional[dict[str, Any]] = None,
    stop_at: Optional[int] = None,
    eval_every: int = 50,
    probe_per_residue: int = 8,
    progress: bool = False,
):
    """Train (or resume, or just load) one twin of the zoo recipe: ``variant`` ``"baseline"``
    (shared grid) or ``"staggered"`` (``window_offsets=offsets``), model and data seed
    ``seed``, the recipe's full schedule truncated at ``stop_at`` steps. Returns `TrainResult`."""
    if variant not in VARIANTS:
        raise UserInputError(f"variant={variant!r} is not one of {VARIANTS}")
    task, model_config, tc = _zoo_defaults(window, stride, architecture)
    tc = dataclasses.replace(tc, seed=seed, eval_every=eval_every, checkpoint_every=eval_every,
                             probe_per_residue=probe_per_residue, snapshot_steps=())
    stop_at = tc.steps if stop_at is None else check_int("stop_at", stop_at, 1, tc.steps, why=" (the recipe's steps)")
    config = model_config(task.vocab.size).replace(seed=seed, window_offsets=offsets if variant == "staggered" else None)
    run_dir = Path(out_dir) / f"{variant}_seed{seed}"
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    done = int(ckpt.name.split("_")[-1]) if ckpt is not None else 0
    return train(config, task, train_config=tc, out_dir=run_dir, resume=True, progress=progress,
                 stop_after=max(stop_at - done, 0), metadata={"experiment": "remedy", "variant": variant})


def memory_per_token(model, length: Optional[int] = None) -> dict[str, float]:
    """KV-cache memory per token after ``length`` tokens (default ``n_ctx``), measured on a cache
    filled by the model itself: ``stored_bytes`` (every compressed entry this implementation
    holds, K and V) and ``closed_bytes`` (only entries whose window has closed, per KV head),
    both divided by ``length``; plus the closed entries per KV head."""
    cfg = model.cfg
    length = cfg.n_ctx if length is None else length
    cache = model.init_cache()
    with torch.inference_mode():
        model(torch.zeros(1, length, dtype=torch.long, device=model.device), cache=cache, return_type=None)
    stored = sum((lc.k_comp.numel() + lc.v_comp.numel()) * lc.k_comp.element_size() for lc in cache.layers)
    per_head = [n_closed_windows(length, cfg.window, cfg.stride, o)
                for layer in range(cfg.n_layers) for o in cfg.layer_window_offsets(layer)]
    element = cache.layers[0].k_comp.element_size()
    closed = sum(per_head) * 2 * cfg.d_head * element
    return {"stored_bytes_per_token": stored / length, "closed_bytes_per_token": closed / length,
            "entries_per_head_min": float(min(per_head)), "entries_per_head_max": float(max(per_head))}


def _boundaries(config) -> list[int]:
    """Phases of the shared stride at which some KV head's windows close."""
    S = config.stride
    return sorted({boundary_phase(S, o) for layer in range(config.n_layers) for o in config.layer_window_offsets(layer)})


@dataclass(frozen=True, eq=False, repr=False)
class RemedyResult(Result):
    """`compare_remedy`'s result. Phases are those of the shared stride, ``t mod S``.

    ``curves``: held-out probe accuracy per (variant, seed, step, phase) during training
    (``n`` prompts per point; 8 per residue = 48 per phase at R = 24, S = 4: a point's 95%
    interval is about +-14 pp). ``profiles``: final accuracy per (variant, seed, phase) on a
    fresh moment-matched evaluation set. ``memory``: measured KV-cache bytes per token per
    (variant, seed). ``boundaries``: per variant, the phases at which some KV head's windows
    close. A phase is *learned* at the first evaluation where its accuracy reaches
    ``threshold``; never-learned phases count as learned after the last step (``steps +
    eval_every``), so a comparison that needs them is flagged rather than silently passed.
    """

    curves: pd.DataFrame
    profiles: pd.DataFrame
    memory: pd.DataFrame
    boundaries: dict
    stride: int
    steps: int
    eval_every: int
    threshold: float = LEARNED
    label: str = "staggered vs shared compression windows"

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", check_real("threshold", self.threshold, 0.0, 1.0, high_open=False,
                                                         why=" (a probe accuracy)"))

    @property
    def premise_notes(self) -> tuple[str, ...]:
        """The premises of the comparison that fail: the baseline has a phase gap to remedy (its
        final best-minus-worst phase accuracy beyond 3 standard errors; the claim "the staggered
        gap is at most half the baseline's" means nothing without one), and the variants use equal
        memory (closed-cache bytes per token within 1%)."""
        notes = list(super().premise_notes)
        base = self.profiles[self.profiles.variant == "baseline"]
        if len(base):
            phase = base.groupby("phase")
            acc = phase.apply(lambda d: np.average(d.accuracy, weights=d.n), include_groups=False)
            gap = stats.phase_gap_note(acc.to_numpy(), phase.n.sum().to_numpy(), "the baseline's final profile")
            notes += [gap] if gap else []
        mem = self.memory.groupby("variant").closed_bytes_per_token.mean() if len(self.memory) else pd.Series()
        if {"baseline", "staggered"} <= set(mem.index) and mem["baseline"] > 0:
            ratio = float(mem["staggered"] / mem["baseline"])
            if abs(ratio - 1) > 0.01:
                notes.append(f"the variants do not use equal memory (staggered / baseline closed-cache bytes per "
                             f"token = {ratio:.3f}): an accuracy difference may be bought with memory")
        return tuple(notes)

    # ------------------------------------------------------------- analyses
    def learned_steps(self) -> pd.DataFrame:
        """Step at which each (variant, seed, phase) is learned (NaN: never, within the run)."""
        rows = []
        for (variant, seed, phase), grp in self.phase_curves().groupby(["variant", "seed", "phase"]):
            hit = grp[grp.accuracy >= self.threshold]
            rows.append(dict(variant=variant, seed=seed, phase=phase, boundary=phase in self.boundaries[variant],
                             step=float(hit.step.min()) if len(hit) else np.nan))
        return pd.DataFrame(rows)

    def phase_curves(self) -> pd.DataFrame:
        """``curves`` folded to phases (mean over the residues of each phase)."""
        g = self.curves.groupby(["variant", "seed", "step", "phase"])
        return g.apply(lambda d: np.average(d.accuracy, weights=d.n), include_groups=False).rename("accuracy").reset_index()

    def gaps(self) -> pd.DataFrame:
        """Best-minus-worst phase accuracy per (variant, step), mean over seeds, and per seed."""
        pc = self.phase_curves()
        per_seed = pc.groupby(["variant", "seed", "step"]).accuracy.agg(lambda a: a.max() - a.min()).rename("gap")
        return per_seed.reset_index()

    def criteria(self) -> dict[str, Any]:
        """The three claims of the remedy, each computed here (see the class docstring)."""
        learned = self.learned_steps()
        late = self.steps + self.eval_every
        stag = learned[learned.variant == "staggered"].fillna({"step": late})
        # A never-learned phase counts as learned after the run: a boundary that is never
        # learned fails however late the interior phases are.
        per_seed = stag.groupby("seed").apply(
            lambda d: np.inf if (d[d.boundary].step >= late).any() else d[d.boundary].step.max() - d[~d.boundary].step.max(),
            include_groups=False)
        gaps = self.gaps()
        mean_gap = gaps.groupby(["variant", "step"]).gap.mean().unstack(0)
        peak = int(mean_gap["baseline"].idxmax())
        final = self.profiles.groupby(["variant", "seed"]).apply(
            lambda d: np.average(d.accuracy, weights=d.n), include_groups=False).groupby("variant").mean()
        never = learned[learned.step.isna()]
        return {
            "boundary_minus_interior_learned_step_staggered": [float(x) for x in per_seed],
            "boundary_no_later_than_interior": bool((per_seed <= self.eval_every).all()),
            "baseline_peak_gap_step": peak,
            "baseline_gap_at_peak": float(mean_gap.loc[peak, "baseline"]),
            "staggered_gap_at_peak": float(mean_gap.loc[peak, "staggered"]),
            "staggered_gap_at_most_half": bool(mean_gap.loc[peak, "staggered"] <= 0.5 * mean_gap.loc[peak, "baseline"]),
            "mean_accuracy_baseline": float(final["baseline"]),
            "mean_accuracy_staggered": float(final["staggered"]),
            "mean_accuracy_within_2pp": bool(final["staggered"] >= final["baseline"] - 0.02),
            "never_learned": [f"{r.variant} seed {r.seed} phase {r.phase}" for r in never.itertuples()],
        }

    def to_dict(self) -> dict[str, Any]:
        learned = self.learned_steps().groupby(["variant", "phase"]).step.mean().unstack(0)
        prof = self.profiles.groupby(["variant", "phase"]).accuracy.mean().unstack(0)
        mem = self.memory.groupby("variant").mean(numeric_only=True)
        out: dict[str, Any] = {"seeds": sorted(int(s) for s in self.curves.seed.unique()), "steps": self.steps,
                               "eval_every": self.eval_every}
        for variant in VARIANTS:
            if variant not in prof:
                continue
            out[f"{variant}_boundary_phases"] = list(self.boundaries[variant])
            out[f"{variant}_final_phase_accuracy"] = [float(x) for x in prof[variant]]
            out[f"{variant}_learned_step_by_phase"] = [float(x) for x in learned[variant]]
            out[f"{variant}_bytes_per_token"] = float(mem.loc[variant, "closed_bytes_per_token"])
        out.update(self.criteria())
        out.update(premise_entries(self.premise_notes))
        return out

    def to_frame(self) -> pd.DataFrame:
        """Tidy final profiles joined with learned steps: one row per (variant, seed, phase)."""
        return self.profiles.merge(self.learned_steps(), on=["variant", "seed", "phase"])

    def plot(self):
        """Phase-resolved learning curves (mean over seeds), one panel per variant."""
        return plotting().mechanisms.remedy_curves(self.phase_curves(), self.boundaries, VARIANTS)


def compare_remedy(
    out_dir: Union[str, Path],
    *,
    seeds: tuple[int, ...] = (0, 1, 2),
    offsets: Any = "staggered",
    window: int = 4,
    stride: int = 4,
    architecture: Optional[dict[str, Any]] = None,
    stop_at: Optional[int] = None,
    eval_every: int = 50,
    n_per_residue: int = DEFAULT_N_PER_RESIDUE,
    progress: bool = False,
) -> RemedyResult:
    """Train (or resume) baseline and staggered twins of the zoo recipe for every seed, then
    evaluate them: phase-resolved learning curves, final phase profiles (``n_per_residue``
    fresh prompts per residue), learned steps and measured memory per token.

    Twins share the seed (initialisation and data), the zoo backbone, task and recipe; the
    only difference is ``window_offsets=offsets`` (default ``"staggered"``: ``o_h =
    h*S // n_kv_heads``; ``"staggered_layers"``: layer ``l`` at ``l*S // n_layers``, for
    one-KV-head models). ``architecture`` overrides the zoo backbone (e.g. ``{"n_kv_heads": 1}``)
    and the gate/payload options (``{"payload": "shared"}``) for both twins alike. ``stop_at``
    truncates the recipe's schedule (the same step for
    every run). Runs live in ``out_dir/<variant>_seed<seed>`` and are resumed, so the twins
    can be trained in parallel processes first (``phaseinterp experiments remedy RUNS STOP W/N``).
    """
    seeds = _check_seeds(seeds)
    curves, profiles, memory, boundaries = [], [], [], {}
    steps = None
    task = _zoo_defaults(window, stride, architecture)[0]
    for seed in seeds:
        for variant in VARIANTS:
            run = twin_run(variant, seed, out_dir, offsets=offsets, window=window, stride=stride,
                           architecture=architecture, stop_at=stop_at,
                           eval_every=eval_every, progress=progress)
            model = run.model
            steps = int(run.log.step.max())
            boundaries[variant] = _boundaries(model.cfg)
            curves.append(run.curves.assign(variant=variant, seed=seed))
            # The evaluation of a finished run is kept beside it (keyed by its step and size).
            stored = Path(out_dir) / f"{variant}_seed{seed}" / f"remedy_eval_step{steps}_n{n_per_residue}.json"
            if stored.is_file():
                evaluation = json.loads(stored.read_text())
            else:
                prof = phase_profile(model, task, n_per_residue=n_per_residue, seed=1, label=f"{variant} seed {seed}", progress=False)
                evaluation = {"accuracy": prof.phase_accuracy.tolist(), "n": prof.phase_n.tolist(),
                              "memory": memory_per_token(model)}
                atomic_write(stored, json.dumps(evaluation).encode())
            profiles.append(pd.DataFrame({"variant": variant, "seed": seed, "phase": np.arange(stride),
                                          "accuracy": evaluation["accuracy"], "n": evaluation["n"]}))
            memory.append({"variant": variant, "seed": seed, **evaluation["memory"]})
    return RemedyResult(curves=pd.concat(curves, ignore_index=True), profiles=pd.concat(profiles, ignore_index=True),
                        memory=pd.DataFrame(memory), boundaries=boundaries, stride=stride, steps=steps,
                        eval_every=eval_every)


def _check_seeds(seeds: Any) -> tuple[int, ...]:
    """The twins' seeds: at least one, each a seed, none twice (a repeated seed trains the same run twice and
    counts it twice in the mean)."""
    items = listed(seeds)
    if not isinstance(items, list) or not items:
        raise UserInputError("seeds must be a non-empty list of seeds; pass at least one (3 or more for a result)")
    seeds = tuple(check_seed("seeds", s) for s in items)
    repeated = sorted(s for s, n in collections.Counter(seeds).items() if n > 1)
    if repeated:
        raise UserInputError(f"seeds={list(seeds)} repeats {repeated}: pass each seed once")
    return seeds


def train_share(out_dir: Union[str, Path], stop_at: int, worker: int, n_workers: int,
                seeds: tuple[int, ...] = (0, 1, 2), offsets: Any = "staggered",
                architecture: Optional[dict[str, Any]] = None) -> None:
    """Train worker ``worker`` of ``n_workers``'s share of the twin runs (variant x seed, round
    robin), each to ``stop_at`` steps, so `compare_remedy` later only evaluates. Command line:
    ``phaseinterp experiments remedy RUNS STOP W/N``."""
    n_workers = check_int("n_workers", n_workers, 1)
    worker = check_int("worker", worker, 0, n_workers - 1)
    check_int("stop_at", stop_at, 1)  # here too: a bad value is refused before the first run trains
    seeds = _check_seeds(seeds)
    held = saved_kind(check_output_dir(out_dir, "out_dir"))
    if held not in (None, "other files"):  # a saved object's folder is never written into
        raise UserInputError(f"out_dir={str(out_dir)!r} holds a {held}: the twin runs go in a folder of their own "
                             "(new, empty, or one holding earlier twin runs)")
    runs = [(v, s) for s in seeds for v in VARIANTS]
    for i, (variant, seed) in enumerate(runs):
        if i % n_workers == worker:
            twin_run(variant, seed, out_dir, stop_at=stop_at, offsets=offsets, architecture=architecture)
            print("done", variant, seed, flush=True)
