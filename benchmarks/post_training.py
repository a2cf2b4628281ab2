"""A post-trained zoo model beside its base on identical prompts (issue 36): mean, phase gap, period.

    python benchmarks/post_training.py [--post w4s4-post] [--n-per-residue 250] [--padding in_sequence|prefix]

The base is the zoo model the post-training run started from (``ZooEntry.init_from``). Both
models answer the same prompts (seed 0), so every change is paired:
- mean change: exact McNemar over all prompts with its interval (`phaseinterp.stats.paired_change`);
  "mean up" when the interval lies above 0;
- per-phase change: the same test within each phase (no multiplicity correction; S tests);
- phase-gap change (best minus worst phase): paired bootstrap, 2,000 replicates resampling prompts
  within each residue group with the same indices for both models, 95% percentile interval;
  "gap down" when the interval lies below 0;
- period kept: the post-trained profile's detected period equals the base's, p < 0.05.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import numpy as np  # noqa: E402

import phaseinterp as pi  # noqa: E402
from phaseinterp import stats  # noqa: E402


def gap_change_interval(base, post, n_boot: int = 2000, seed: int = 0, confidence: float = 0.95):
    """Paired bootstrap of ``phase_gap(post) - phase_gap(base)`` over prompts within residue groups.

    Returns (change, lower, upper) as fractions. Both profiles must hold the same prompts in the
    same order (same task and seed)."""
    rb, rp = base.records, post.records
    if not (rb.target_pos.to_numpy() == rp.target_pos.to_numpy()).all():
        raise ValueError("the two profiles were not measured on the same prompts")
    S = base.stride
    cb, cp = rb.correct.to_numpy(bool), rp.correct.to_numpy(bool)
    residue, phase = rb.residue.to_numpy(), rb.phase.to_numpy()
    groups = [np.flatnonzero(residue == r) for r in np.unique(residue)]
    rng = np.random.default_rng(seed)

    def gap(correct, idx):
        acc = np.bincount(phase[idx], weights=correct[idx], minlength=S) / np.bincount(phase[idx], minlength=S)
        return acc.max() - acc.min()

    every = np.concatenate(groups)
    observed = gap(cp, every) - gap(cb, every)
    draws = np.empty(n_boot)
    for b in range(n_boot):
        idx = np.concatenate([g[rng.integers(0, len(g), len(g))] for g in groups])
        draws[b] = gap(cp, idx) - gap(cb, idx)
    tail = (1 - confidence) / 2
    return float(observed), float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))


def compare(post_name: str, n_per_residue: int = 250, padding: str | None = None, seed: int = 0) -> dict:
    """Profiles of ``post_name`` and its base on the same prompts, and the paired changes."""
    base_name = pi.zoo.entry(post_name).init_from
    if base_name is None:
        raise ValueError(f"{post_name} is not a post-trained zoo model (no init_from)")
    profiles = {}
    for name in (base_name, post_name):
        model = pi.zoo.load(name)
        task = pi.zoo.task_for(model)
        if padding:
            task = dataclasses.replace(task, padding=padding)
        profiles[name] = pi.phase_profile(model, task, n_per_residue=n_per_residue, seed=seed, label=name, progress=False)
    base, post = profiles[base_name], profiles[post_name]
    cb, cp = base.records.correct.to_numpy(bool), post.records.correct.to_numpy(bool)
    mean = stats.paired_change(cb, cp)
    phase = base.records.phase.to_numpy()
    per_phase = [stats.paired_change(cb[phase == g], cp[phase == g]) for g in range(base.stride)]
    return dict(base=base, post=post, mean=mean, per_phase=per_phase, gap=gap_change_interval(base, post, seed=seed))


def _row(p, step) -> str:
    phases = ", ".join(f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, lo, hi in zip(p.phase_accuracy, p.phase_lower, p.phase_upper))
    period = f"{p.period} ({p.period_p_value:.4f})" if p.period is not None else \
        f"none (best {p.best_period}, p={p.period_p_value:.3f})"
    return (f"| {p.label} | {step} | {p.mean:.3f} | {phases} | {int(np.nanargmin(p.phase_accuracy))} | "
            f"{100 * p.phase_gap:.1f} | {period} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--post", default="w4s4-post")
    parser.add_argument("--n-per-residue", type=int, default=250)
    parser.add_argument("--padding", default=None, choices=["prefix", "in_sequence"])
    args = parser.parse_args()
    r = compare(args.post, args.n_per_residue, args.padding)
    base, post = r["base"], r["post"]
    print(f"# post-training: {base.label} -> {post.label}, {args.n_per_residue} prompts per residue, R = 24, "
          f"padding {args.padding or 'as stored (in_sequence)'}, seed 0, the same prompts for both")
    print("| model | step | mean | phase accuracies [95% CI] | worst phase | phase gap (pp) | period (p) |")
    print("|---|---|---|---|---|---|---|")
    for p in (base, post):
        print(_row(p, pi.zoo.load(p.label).metadata.get("step")))
    m = r["mean"]
    g, glo, ghi = r["gap"]
    print()
    print("| change (post - base) | pp [95% CI] | lost / gained prompts | paired p |")
    print("|---|---|---|---|")
    print(f"| mean | {100 * m.change:+.1f} [{100 * m.lower:+.1f}, {100 * m.upper:+.1f}] | {int(m.lost)} / "
          f"{int(m.gained)} | {float(m.p_value):.2g} (McNemar) |")
    for k, c in enumerate(r["per_phase"]):
        print(f"| phase {k} | {100 * c.change:+.1f} [{100 * c.lower:+.1f}, {100 * c.upper:+.1f}] | {int(c.lost)} / "
              f"{int(c.gained)} | {float(c.p_value):.2g} (McNemar) |")
    print(f"| phase gap | {100 * g:+.1f} [{100 * glo:+.1f}, {100 * ghi:+.1f}] | - | (paired bootstrap, 2,000) |")
    print(f"| period | {base.period} -> {post.period} (p = {post.period_p_value:.4f}) | - | - |")


if __name__ == "__main__":
    main()
