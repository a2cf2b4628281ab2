"""Every number of RESULTS.md's mechanism and equal-training sections, printed by one script.

    python benchmarks/mechanism_results.py [--sections controls curves positions specialization cycling confirm]
                                           [--n-per-residue 250] [--confirm-per-residue 100]

Sections:
- ``controls``: the equal-training rule (`zoo.equal_training_step`) on the shipped training
  curves, and the phase profiles of the equal-step and final-step pairs (250 prompts per residue);
- ``curves``: the phase-resolved learning curves of w4s4 and its twin (from curves.csv);
- ``positions``: where targets sit in the zoo task (positions and key-to-query distances);
- ``specialization``: per-KV-head mean replacement on w4s4, w8s8-4kv and w4s4-1kv-shared:
  change in pp with Holm-adjusted intervals, relative change, and the hurt phases per unit;
- ``cycling``: gate cycling on w4s4-1kv-shared (fit for it) and on w4s4 (per-slot payloads:
  the negative control), every score of `cycling_scores` and the identification table;
- ``confirm``: `confirm(model)` on w4s4 and w8s8-4kv: ablation agreement and held-out
  confirmation of gate-nominated heads.
Prompts: seed 0 (evaluation), calibration seed 1, nomination seed 2; one thread.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

import phaseinterp as pi  # noqa: E402
from phaseinterp import zoo  # noqa: E402
from phaseinterp.interventions import confirm, cycling_fitness, gate_cycling_profile  # noqa: E402

pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)


def controls(n: int) -> None:
    print("## equal-training controls")
    a, b = zoo.run_curves("w4s4"), zoo.run_curves("full")
    means = pd.DataFrame({"w4s4": a.groupby("step").accuracy.mean(), "full": b.groupby("step").accuracy.mean()})
    print("held-out probe mean accuracy per step (8 prompts per residue, from the shipped curves.csv):")
    print(means.round(3).T.to_string())
    print(f"equal_training_step(w4s4, full, min_mean={zoo.LEARNED_MEAN}) = {zoo.equal_training_step(a, b)}")
    for kind, (compressed, twin) in zoo.training_controls("w4s4").items():
        for name in (compressed, twin):
            model = zoo.load(name)
            p = pi.phase_profile(model, zoo.task_for(model), n_per_residue=n, seed=0, stride=4, label=name, progress=False)
            phases = ", ".join(f"{x:.3f} [{lo:.3f}, {hi:.3f}]"
                               for x, lo, hi in zip(p.phase_accuracy, p.phase_lower, p.phase_upper))
            period = p.period if p.period is not None else f"none (best {p.best_period}, p={p.period_p_value:.3f})"
            print(f"{kind:10s} {name:11s} step {model.metadata.get('step')}: mean {p.mean:.3f}; phases {phases}; "
                  f"phase gap {100 * p.phase_gap:.1f} pp; period {period} (p={p.period_p_value:.4f}); "
                  f"homogeneity p={p.homogeneity_p_value:.3g}", flush=True)


def curves(n: int) -> None:
    print("## learning curves (held-out probe, 8 prompts per residue; shipped curves.csv)")
    for name in ("w4s4", "full"):
        c = zoo.run_curves(name)
        table = c.groupby(["step", "phase"]).accuracy.mean().unstack()
        table.insert(0, "mean", c.groupby("step").accuracy.mean())
        print(f"### {name}")
        print(table.round(3).T.to_string())


def positions(n: int) -> None:
    print("## target positions in the zoo task")
    task = zoo.task_for(zoo.load("w4s4"))
    batch = task.generate(n, seed=0)
    meta = batch.meta
    query = int(batch.answer_pos[0])
    print(f"answer position {query}; target key positions {meta.target_pos.min()}..{meta.target_pos.max()}; "
          f"distance from the target key to the answer position {query - meta.target_pos.max()}.."
          f"{query - meta.target_pos.min()} tokens ({len(meta)} prompts)")


def specialization(n: int) -> None:
    print("## head x phase specialization (mean replacement, exact paired tests, Holm over units x phases)")
    for name in ("w4s4", "w8s8-4kv", "w4s4-1kv-shared"):
        model = zoo.load(name)
        res = pi.ablate(model, n_per_residue=n, n_calibration=256, progress=False)
        tests = res.phase_tests("holm")
        print(f"### {name}: clean accuracy by phase {np.round(res.clean.to_numpy(), 3).tolist()}")
        cells = tests.assign(cell=[f"{c:+.1f} [{lo:+.1f}, {hi:+.1f}] ({r:+.1f}%){'*' if s else ''}"
                                   for c, lo, hi, r, s in zip(tests.change_pp, tests.ci_low_pp, tests.ci_high_pp,
                                                              tests.relative_change, tests.significant)])
        print("change in pp [Holm-adjusted interval] (relative change), * significant:")
        print(cells.pivot(index=["layer", "kv_head"], columns="phase", values="cell").to_string())
        spec = res.specialization()
        print(spec[["layer", "kv_head", "phases", "hurt_phases", "worst_change", "worst_change_pp"]].round(1)
              .to_string(index=False), flush=True)


def cycling(n: int) -> None:
    print("## gate cycling")
    for name in ("w4s4-1kv-shared", "w4s4"):
        model = zoo.load(name)
        fit, why = cycling_fitness(model)
        label = "" if fit else "  [NEGATIVE CONTROL]"
        res = gate_cycling_profile(model, n_per_residue=n, progress=False, n_boot=1000)
        s = res.scores
        print(f"### {name}{label}: {why}")
        print(res.phase_accuracy().round(3).to_string())
        cols = ["shift", "r2", "corr2", "slope", "intercept", "r2_all", "r2_interior", "corr2_all", "mae",
                "mean_drop", "displacement", "identified", "identification_p", "boundary_rank"]
        print(s["per_shift"][cols].round(3).to_string(index=False))
        print(f"pooled ({(res.stride - 1) * s['n_shifts']} points): R^2 {s['r2_pooled']:.3f}, "
              f"r^2 {s['corr2_pooled']:.3f}; identified {s['n_identified']} of {s['n_shifts']}, "
              f"joint permutation p {s['identification_p']:.4f}")
        print(res.identification().round(3).to_string())
        ci = res.intervals()
        print("95% bootstrap intervals (prompts resampled within residues):")
        print(ci.loc[[i for i in ci.index if i.startswith(("r2[", "corr2[", "r2_pooled", "corr2_pooled"))]]
              .round(3).T.to_string(), flush=True)


def confirmation(n: int) -> None:
    print("## confirmatory pipeline")
    for name in ("w4s4", "w8s8-4kv"):
        res = confirm(zoo.load(name), n_per_residue=n, n_calibration=256, progress=False)
        print(f"### {name}")
        print(res.summary().to_string())
        print(res.agreement.round(3).to_string(index=False))
        print(res.nominations.round(3).to_string(index=False), flush=True)


SECTIONS = {"controls": controls, "curves": curves, "positions": positions, "specialization": specialization, "cycling": cycling}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="*", default=[*SECTIONS, "confirm"],
                        choices=[*SECTIONS, "confirm"])
    parser.add_argument("--n-per-residue", type=int, default=250)
    parser.add_argument("--confirm-per-residue", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for section in args.sections:
        if section == "confirm":
            confirmation(args.confirm_per_residue)
        else:
            SECTIONS[section](args.n_per_residue)


if __name__ == "__main__":
    main()
