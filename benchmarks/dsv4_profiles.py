"""Phase profiles and indexer selection of the tiny HF DeepSeek-V4 zoo models (issue 12).

    python benchmarks/dsv4_profiles.py [--n-per-residue 250] [--models dsv4-tiny dsv4.1-tiny]

For each shipped model: `phase_profile` on its stored task (R = 24, moment-matched targets,
Wilson intervals on pooled phase counts, permutation-test period) and `indexer_phase` (how
often each CSA layer's Lightning Indexer keeps an entry holding the target's value, by phase).
Prints markdown rows for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import phaseinterp as pi
from phaseinterp.interventions.indexer import indexer_phase
from phaseinterp.zoo import deepseek_v4 as hf_zoo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-per-residue", type=int, default=250)
    parser.add_argument("--models", nargs="*", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.models or hf_zoo.available()
    print("| model | mean | phase accuracies [95% CI] | worst phase | phase gap (pp) | period (p) | homogeneity p |")
    print("|---|---|---|---|---|---|---|")
    selections = {}
    for name in names:
        t0 = time.time()
        model = pi.zoo.load(name)
        task = pi.zoo.task_for(model)
        batch = task.generate(args.n_per_residue, seed=0)
        p = pi.phase_profile(model, batch, label=name, progress=False)
        phases = ", ".join(f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, lo, hi in
                           zip(p.phase_accuracy, p.phase_lower, p.phase_upper))
        period = f"{p.period} ({p.period_p_value:.4f})" if p.period else f"none (best {p.best_period}, p={p.period_p_value:.3f})"
        print(f"| {name} | {p.mean:.3f} | {phases} | {int(np.nanargmin(p.phase_accuracy))} | "
              f"{100 * p.phase_gap:.1f} | {period} | {p.homogeneity_p_value:.3g} |")
        selections[name] = (indexer_phase(model, task, prompts=batch), time.time() - t0)
    for name, (sel, seconds) in selections.items():
        print(f"\n{name}: indexer keeps an entry holding the target's value (top-{sel.top_k}), by phase "
              f"({seconds:.0f} s for profile + selection)")
        print("| layer | " + " | ".join(f"phase {s}" for s in range(sel.stride)) + " | homogeneity p | mean rank |")
        print("|---|" + "---|" * sel.stride + "---|---|")
        summary = sel.to_dict()
        frame = sel.to_frame()
        for layer, info in summary["layers"].items():
            sub = frame[frame.layer == layer].sort_values("phase")
            cells = " | ".join(f"{r:.3f} [{lo:.3f}, {hi:.3f}]" for r, lo, hi in zip(sub.rate, sub.lower, sub.upper))
            print(f"| {layer} | {cells} | {info['homogeneity_p_value']:.3g} | {info['mean_value_rank']:.2f} |")


if __name__ == "__main__":
    main()
