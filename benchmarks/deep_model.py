"""Every issue-13 number on the paper-depth model and its twin, at N prompts per residue.

    python benchmarks/deep_model.py [--model deep12-w8s8-1kv-shared] [--twin deep12-full]
                                    [--n-per-residue 72] [--sections profile ablate cycle controls]
                                    [--threads 1]

Sections (each prints what RESULTS.md "Paper-depth models and seeds" records):

- ``profile``: the phase profile of the model and of its twin (folded at the model's stride):
  mean, period test, per-phase accuracy with 95% intervals, weakest phases first;
- ``ablate``: `phaseinterp.ablate(model, layer=9)` (the literal call), then the all-layer
  sweep and its specialization table (<= -50%, Holm over units x phases);
- ``cycle``: gate cycling for shifts -3..3 (without 0), every layer's gates or ``--cycle-layers``:
  per-shift parameter-free R² (boundary excluded), squared correlation, shift identification
  and the joint permutation p;
- ``controls``: the equal-training pair (`zoo.training_controls`) profiled the same way.

``--model``/``--twin``: zoo names or checkpoint directories (a run's ``snapshot_*``), so the
same script measures the intermediate snapshots of a build.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

import phaseinterp as pi  # noqa: E402

SECTIONS = ("profile", "ablate", "cycle", "controls")


def load(source: str):
    if os.path.isdir(source):
        return pi.CompressedTransformer.from_pretrained(source).eval()
    return pi.zoo.load(source)


def show_profile(model, prompts, label: str, stride: int) -> None:
    p = pi.phase_profile(model, prompts, stride=stride, seed=0, label=label, progress=False)
    print(f"profile {label}: mean {p.mean:.3f}, period {p.period} (best {p.best_period}, "
          f"p = {p.period_p_value:.4f}), homogeneity p = {p.homogeneity_p_value:.3g}, "
          f"phase gap {100 * p.phase_gap:.1f} pp")
    for g in range(p.stride):
        print(f"  phase {g}: {p.phase_accuracy[g]:.3f} [{p.phase_lower[g]:.3f}, {p.phase_upper[g]:.3f}]")
    print("  weakest first:", np.argsort(p.phase_accuracy).tolist(), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deep12-w8s8-1kv-shared")
    parser.add_argument("--twin", default="deep12-full", help="'none' to skip")
    parser.add_argument("--n-per-residue", type=int, default=72)
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--cycle-layers", type=int, nargs="+", default=None,
                        help="shift the gates of these layers only (default: every layer)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.n_per_residue < 1 or args.threads < 1:
        parser.error("--n-per-residue and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    t0 = time.time()
    model = load(args.model)
    task = pi.zoo.task_for(model)
    prompts = task.generate(args.n_per_residue, seed=0)
    S = model.cfg.stride

    if "profile" in args.sections:
        show_profile(model, prompts, args.model, S)
        if args.twin != "none":
            twin = load(args.twin)
            show_profile(twin, pi.zoo.task_for(twin).generate(args.n_per_residue, seed=0), args.twin, S)
        print(f"[{time.time() - t0:.0f} s]", flush=True)

    if "ablate" in args.sections:
        layer9 = pi.ablate(model, layer=9, prompts=prompts, progress=False)
        print("ablate(model, layer=9): relative change (%)")
        print(layer9.relative_change.round(1).to_string())
        sweep = pi.ablate(model, prompts=prompts, progress=False)
        print("clean accuracy by phase:", sweep.clean.round(3).tolist())
        print("all layers, relative change (%):")
        print(sweep.relative_change.round(1).to_string())
        print("all layers, absolute change (pp):")
        print(sweep.absolute_change.round(1).to_string())
        spec = sweep.specialization()
        print("specialization (<= -50%, Holm):")
        print(spec.to_string(index=False))
        print(f"[{time.time() - t0:.0f} s]", flush=True)

    if "cycle" in args.sections:
        cyc = pi.gate_cycling_profile(model, shifts=(-3, -2, -1, 1, 2, 3), layers=args.cycle_layers, prompts=prompts,
                              n_boot=200, progress=False)
        print(f"gate cycling (layers: {args.cycle_layers or 'all'}), accuracy by phase (rows: shift):")
        print(cyc.phase_accuracy().round(3).to_string())
        scores = cyc.scores
        print(scores["per_shift"].to_string(index=False))
        print({k: v for k, v in scores.items() if k != "per_shift"})
        print(cyc.identification().round(3).to_string())
        print(cyc.intervals().round(3).to_string())
        print(f"[{time.time() - t0:.0f} s]", flush=True)

    if "controls" in args.sections:
        name = model.metadata.get("zoo_name", "")
        for kind, (compressed, twin) in pi.zoo.training_controls(name).items():
            print(f"{kind} pair: {compressed} / {twin} at steps {pi.zoo.snapshot_step(compressed)} / "
                  f"{pi.zoo.snapshot_step(twin)}")
            for n in (compressed, twin):
                m = pi.zoo.load(n)
                show_profile(m, pi.zoo.task_for(m).generate(args.n_per_residue, seed=0), n, S)
        print(f"[{time.time() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
