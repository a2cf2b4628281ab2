"""Whole-profile gate cycling with its unshifted row taken from a phase profile (``baseline=``),
beside the same call that reruns it.

    python benchmarks/cycling_baseline.py [--models w4s4-1kv-shared dsv4-tiny deep12-w8s8-1kv-shared-equal]
                                          [--every 4] [--shifts 1 -1] [--repeats 3] [--threads 1]

For each model, on every ``--every``-th prompt of its task's 72-per-residue set (seed 0): one
`phase_profile`, then `gate_cycling_profile(..., shifts)` without and with ``baseline=`` that profile,
alternated ``--repeats`` times; median seconds, their ratio, the ratio one pass fewer predicts
(``(n + 1) / n`` for n shifts, before the one-batch check), and whether the per-prompt results are
identical.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import phaseinterp as pi  # noqa: E402


def load(name: str):
    from phaseinterp.zoo import deepseek_v4 as hf_zoo

    return hf_zoo.load(name) if name in hf_zoo.available() else pi.zoo.load(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["w4s4-1kv-shared", "dsv4-tiny",
                                                         "deep12-w8s8-1kv-shared-equal"])
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--shifts", type=int, nargs="+", default=[1, -1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pi.keep_freed_memory()
    print(f"torch threads {args.threads}, shifts {args.shifts}, median of {args.repeats}, "
          f"load {os.getloadavg()[0]:.2f} at start")
    print("| model | prompts | profile (s) | cycling, rerun shift 0 (s) | cycling, baseline= (s) | ratio | "
          "one pass fewer predicts | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        model = load(name)
        task = pi.zoo.task_for(model)
        full = task.generate(72, seed=0)
        batch = full.subset(np.arange(0, len(full), args.every))
        start = time.perf_counter()
        profile = pi.phase_profile(model, batch, progress=False)
        t_profile = time.perf_counter() - start
        times: dict[str, list[float]] = {"rerun": [], "baseline": []}
        results = {}
        for _ in range(args.repeats):
            for key, extra in (("rerun", {}), ("baseline", {"baseline": profile})):
                start = time.perf_counter()
                results[key] = pi.gate_cycling_profile(model, task, args.shifts, prompts=batch, n_boot=10, progress=False,
                                               **extra)
                times[key].append(time.perf_counter() - start)
        rerun, reuse = statistics.median(times["rerun"]), statistics.median(times["baseline"])
        same = bool(np.array_equal(results["rerun"].correct, results["baseline"].correct))
        n = len(args.shifts)
        print(f"| {name} | {len(batch)} | {t_profile:.2f} | {rerun:.2f} | {reuse:.2f} | {rerun / reuse:.2f}x | "
              f"{(n + 1) / n:.2f}x | {same} |")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
