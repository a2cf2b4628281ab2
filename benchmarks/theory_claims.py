"""The two claims of the idealized induction model (docs/science.md section 4), measured.

    python benchmarks/theory_claims.py [--seeds 50] [--threads 1] [--skip-search] [--skip-flow] [--only 0 3]
    python benchmarks/theory_claims.py --details   # the single runs RESULTS quotes

Theorem 1: global search (all one-hot assignments + projected-gradient refinement from 16
random starts and the 4 best one-hot points) over a grid of (N, S, m), L = 2, eps = 0, at
several (gamma, beta). Theorem 2: gradient flow (Dormand-Prince, rtol 1e-5) of log-linear
gates from random inits of radius rho, one run per seed; fraction of seeds where every head
ends with p^K(r_h) >= 0.95 and p^V(r_h+1) >= 0.95 in the worst chunk of the population,
fraction whose slots stay fixed once chosen, collision frequency (and the chance value for
heads choosing independently and uniformly among the S-1 non-boundary slots), and whether
the loss decreased at every accepted step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from phaseinterp.theory import (
    IdealizedInductionModel,
    flow_seeds,
    global_search,
    gradient_descent,
    gradient_flow,
    search_grid,
)

GRID = [(6, 3, 1), (6, 3, 2), (8, 3, 2), (8, 4, 1), (8, 4, 2), (8, 4, 3), (10, 5, 2), (10, 5, 4)]
# m = S-1 with three chunks and with a larger vocabulary: (N, S, L, m)
GRID_MORE = [(9, 3, 3, 2), (12, 4, 3, 3), (12, 3, 2, 2), (14, 4, 2, 3)]
# m < S-1: where does the claim stop holding? (N, S, m) x gamma x beta
FINE, FINE_GAMMA, FINE_BETA = [(6, 3, 1), (8, 4, 2)], [0.5, 2.0, 8.0], [0.5, 0.75, 1.0, 1.5, 2.0]
SCALES = [(0.5, 0.5), (2.0, 4.0), (8.0, 8.0), (32.0, 32.0)]
# (label, N, S, L, m, gamma, beta, rho, t_max)
FLOWS = [
    ("S=3 m=2, rho=0.01", 6, 3, 2, 2, 2.0, 4.0, 0.01, 5000.0),
    ("S=3 m=2, rho=1", 6, 3, 2, 2, 2.0, 4.0, 1.0, 5000.0),
    ("S=3 m=2, gamma=8, rho=0.01", 6, 3, 2, 2, 8.0, 4.0, 0.01, 5000.0),
    ("S=4 m=3, rho=0.01 (MC 2048)", 8, 4, 2, 3, 2.0, 4.0, 0.01, 5000.0),
    ("S=4 m=2, rho=0.01 (MC 2048)", 8, 4, 2, 2, 2.0, 4.0, 0.01, 5000.0),
    ("S=3 m=1, rho=0.01", 6, 3, 2, 1, 2.0, 4.0, 0.01, 5000.0),
    ("S=3 m=2, beta=0.5, rho=0.01", 6, 3, 2, 2, 2.0, 0.5, 0.01, 20000.0),
]


def flow_line(run) -> str:
    """One run on one line (the result's repr is a table)."""
    s = run.to_dict()
    return (f"{s['method']}, N={s['N']} S={s['S']} L={s['L']} m={s['heads']}, seed={s['seed']}: "
            f"slots={s['slots']}, min p^K={s['min_p_key']:.3f}, min p^V={s['min_p_value']:.3f}, "
            f"loss {s['loss_start']:.4f} -> {s['loss_end']:.4f} at t={s['t_end']:.4g}")


def search_line(result) -> str:
    """One global search on one line."""
    s = result.to_dict()
    return (f"N={s['N']} S={s['S']} L={s['L']} m={s['heads']} eps={s['eps']:g}: minimizer {s['minimizer']} "
            f"loss {s['best_loss']:.5f}, margin {s['margin']:.3g}, holds={s['holds']}")


def details() -> None:
    """The individual runs RESULTS quotes: a slow approach, a token-keyed gate, slot switches,
    spread gates with too few heads, and small-step gradient descent against the flow."""
    flow = dict(stop_at=0.95, rtol=1e-5, atol=1e-8)
    model = IdealizedInductionModel(6, 3, 2, heads=2, gamma=8.0, beta=4.0)
    run = gradient_flow(model, rho=0.01, seed=0, t_max=5000, **flow)
    paired = run._paired(run.min_p)
    print("\ngamma=8, seed 0: worst-chunk min(p^K(r_h), p^V(r_h+1)) and loss over the last records")
    for i in range(-5, 0):
        print(f"  t={run.t[i]:6.0f}  {[round(float(paired[i, h, r]), 4) for h, r in enumerate(run.slots())]}  "
              f"loss {run.loss[i]:.5f}")
    run = gradient_flow(IdealizedInductionModel(6, 3, 2, heads=2), rho=1.0, seed=14, t_max=5000, **flow)
    print(f"\nrho=1, seed 14: {flow_line(run)}"
          f"\n  population-mean p[head, branch, slot] {run.mean_p[-1].round(3).tolist()}"
          f"\n  worst-chunk p {run.min_p[-1].round(3).tolist()}")
    model = IdealizedInductionModel(6, 3, 2, heads=2, gamma=2.0, beta=0.5)
    for seed in (14, 49):
        run = gradient_flow(model, rho=0.01, seed=seed, t_max=20000, **flow)
        print(f"\nbeta=0.5, seed {seed}: slots {run.slots()}, slot fixed {run.slot_fixed()}, "
              f"chosen at t = {[round(t) for t in run.choice_times()]}")
        for h in range(2):
            print(f"  head {h}: leading key slot over time {run.mean_p[:, h, 0].argmax(-1).tolist()}")
    run = gradient_flow(IdealizedInductionModel(6, 3, 2, heads=1), rho=0.01, seed=0, t_max=3000, **flow)
    print(f"\nm=1 (N=6 S=3), seed 0 at t={run.t[-1]:.0f}: p^K {run.mean_p[-1, 0, 0].round(3).tolist()}, "
          f"p^V {run.mean_p[-1, 0, 1].round(3).tolist()}")
    model = IdealizedInductionModel(6, 3, 2, heads=2, max_exact=1)
    sample = model.population(n_samples=128, seed=0)
    times = [25.0, 50.0, 100.0]
    ode = gradient_flow(model, rho=0.5, seed=1, t_max=100, stop_at=None, t_eval=times, population=sample,
                        rtol=1e-9, atol=1e-12)
    at = [int(np.argmin(np.abs(ode.t - t))) for t in times]
    print("\nsmall-step gradient descent vs the flow (N=6 S=3 m=2, 128-sequence sample, rho=0.5, t = 25, 50, 100):")
    for eta in (2.5, 1.25, 0.625):
        gd = gradient_descent(model, learning_rate=eta, t_max=100, rho=0.5, seed=1, population=sample,
                              record_every=round(25 / eta))
        gd_at = [int(np.argmin(np.abs(gd.t - t))) for t in times]
        print(f"  eta={eta}: max |p_GD - p_flow| = {np.abs(gd.mean_p[gd_at] - ode.mean_p[at]).max():.4f}")
    print(f"  (the flow itself moved p by up to {np.abs(ode.mean_p[at[-1]] - ode.mean_p[0]).max():.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--skip-flow", action="store_true")
    parser.add_argument("--only", type=int, nargs="*", help="indices into the flow list")
    parser.add_argument("--details", action="store_true", help="only the individual runs RESULTS quotes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.details:
        details()
        return
    if not args.skip_search:
        print("## Theorem 1: global search, L=2, eps=0, kappa=0.1")
        for gamma, beta in SCALES:
            start = time.perf_counter()
            grid = search_grid(GRID, gamma=gamma, beta=beta, n_random=16, n_refine_best=4, steps=300)
            df = grid.to_frame()
            print(f"\ngamma={gamma:g} beta={beta:g} ({time.perf_counter() - start:.0f} s)")
            cols = ["N", "S", "heads", "minimizer", "best_loss", "best_refined_loss", "margin", "holds"]
            print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        print("\nm = S-1, more chunks / larger vocabulary: holds at (gamma, beta) =")
        for N, S, L, m in GRID_MORE:
            cells = []
            for gamma, beta in SCALES:
                grid = search_grid([(N, S, m)], L=L, gamma=gamma, beta=beta, n_random=16, n_refine_best=4, steps=300)
                cells.append(f"({gamma:g},{beta:g}):{grid.holds()}")
            print(f"  N={N} S={S} L={L} m={m}: " + " ".join(cells))
        print("\nm < S-1, finer scan (L=2): T = claim holds, F = a refined point beats every one-hot assignment")
        for N, S, m in FINE:
            for gamma in FINE_GAMMA:
                holds = [search_grid([(N, S, m)], gamma=gamma, beta=beta, n_random=16, steps=300).holds()
                         for beta in FINE_BETA]
                cells = [f"beta={beta:g}:{'T' if h else 'F'}" for beta, h in zip(FINE_BETA, holds)]
                print(f"  N={N} S={S} m={m} gamma={gamma:g}: " + " ".join(cells))
        print("\neps > 0 (gamma=2, beta=4; population enumerated exactly; two embedding draws each):")
        for N, S, m, eps in [(6, 3, 2, 0.05), (6, 3, 2, 0.15), (7, 3, 2, 0.1)]:
            for seed in (0, 1):
                model = IdealizedInductionModel(N, S, 2, heads=m, eps=eps, seed=seed)
                print(f"  {search_line(global_search(model, n_random=16, steps=300))}")
    if args.skip_flow:
        return
    print("\n## Theorem 2: gradient flow of log-linear gates, kappa=0.1, eps=0, threshold 0.95 (worst chunk)")
    for i, (label, N, S, L, m, gamma, beta, rho, t_max) in enumerate(FLOWS):
        if args.only and i not in args.only:
            continue
        start = time.perf_counter()
        model = IdealizedInductionModel(N, S, L, heads=m, gamma=gamma, beta=beta)
        sweep = flow_seeds(model, range(args.seeds), rho=rho, t_max=t_max, stop_at=0.95, rtol=1e-5, atol=1e-8)
        s = sweep.to_dict()
        df = sweep.to_frame()
        print(f"\n{label}: N={N} S={S} L={L} m={m} gamma={gamma:g} beta={beta:g} rho={rho:g} t_max={t_max:g}, "
              f"population {sweep.runs[0].settings['population']} ({sweep.runs[0].settings['n_sequences']} sequences), "
              f"{s['seeds']} seeds, {time.perf_counter() - start:.0f} s")
        print(f"  reached 0.95: {s['fraction_reached']:.2f}   slot fixed once chosen: {s['fraction_slot_fixed']:.2f}   "
              f"collisions: {s['collision_frequency']:.2f} (chance {s['chance_collision']:.2f})   "
              f"loss monotone: {s['monotone_fraction']:.2f}   median t(0.95): {s['median_time_to_threshold']:.0f}")
        print(f"  final worst-chunk p^K(r_h): min {df.min_p_key.min():.3f} median {df.min_p_key.median():.3f}; "
              f"p^V(r_h+1): min {df.min_p_value.min():.3f} median {df.min_p_value.median():.3f}; "
              f"slot counts {s['slot_counts']}")
        failed = df[~df.reached]
        print(f"  seeds not reaching 0.95: {failed.seed.tolist()} (their slots {failed.slots.tolist()})", flush=True)


if __name__ == "__main__":
    main()
