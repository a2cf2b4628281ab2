"""Phase profiles of every shipped zoo model at 250 prompts per residue (R = 24): the table in RESULTS.md.

    python benchmarks/zoo_profiles.py [--n-per-residue 250] [--padding in_sequence|prefix]
"""

from __future__ import annotations

import argparse
import dataclasses
import os

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import numpy as np  # noqa: E402

import phaseinterp as pi  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-per-residue", type=int, default=250)
    parser.add_argument("--padding", default=None, choices=["prefix", "in_sequence"])
    parser.add_argument("--models", nargs="*", default=None)
    args = parser.parse_args()
    print(f"# zoo profiles: {args.n_per_residue} prompts per residue, R = 24, padding "
          f"{args.padding or 'as stored (in_sequence)'}, seed 0")
    print("| model | step | mean | phase accuracies [95% CI] | worst phase | phase gap (pp) | residue gap (pp) | "
          "period (p) | homogeneity p |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models or pi.zoo.available():
        model = pi.zoo.load(name)
        task = pi.zoo.task_for(model)
        if args.padding:
            task = dataclasses.replace(task, padding=args.padding)
        p = pi.phase_profile(model, task, n_per_residue=args.n_per_residue, seed=0, label=name)
        phases = ", ".join(f"{a:.3f} [{lo:.3f}, {hi:.3f}]"
                           for a, lo, hi in zip(p.phase_accuracy, p.phase_lower, p.phase_upper))
        worst = int(np.nanargmin(p.phase_accuracy))
        period = f"{p.period} ({p.period_p_value:.4f})" if p.period is not None else \
            f"none (best {p.best_period}, p={p.period_p_value:.3f})"
        print(f"| {name} | {model.metadata.get('step')} | {p.mean:.3f} | {phases} | {worst} | "
              f"{100 * p.phase_gap:.1f} | {100 * p.gap:.1f} | {period} | {p.homogeneity_p_value:.3g} |", flush=True)


if __name__ == "__main__":
    main()
