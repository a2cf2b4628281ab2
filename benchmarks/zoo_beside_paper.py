"""The zoo beside the paper: each shipped zoo model with a published counterpart, profiled here and compared
with the published run in the same statistic (phaseinterp.paper.compare). Prints a markdown table.

    python benchmarks/zoo_beside_paper.py [--n-per-residue 72]
    python benchmarks/zoo_beside_paper.py --cycling     # gate cycling: the paper's R² (corr2) per shift
    python benchmarks/zoo_beside_paper.py --knockout [--models w4s4-1kv-shared w8s8-4kv]
                                                        # knockout maps: specialized (layer, KV head) units
"""

import argparse
import time

import phaseinterp as pi

PAIRS = [  # (zoo model, published run): the closest geometry the paper published
    ("w4s4-1kv-shared", "kvc_w4s4_1kv"),
    ("w8s8-4kv", "kvc_w8s8_4kv"),
    ("w12s12-4kv", "kvc_w12s12_1kv"),  # the paper's W12/S12 4 KV has cycling only; its profile is the 1 KV run's
    ("deep12-w8s8-1kv-shared-equal", "kvc_w8s8_1kv_baseline"),
    ("deep12-w8s8-1kv-shared-seed1-equal", "kvc_w8s8_1kv_baseline_seed43"),
    ("deep12-full-equal", "full_attn_1kv"),
]


CYCLING = [  # (zoo model, shifts, published gate-cycling run to set beside it)
    ("w4s4-1kv-shared", [-1, 1, 2], "kvc_w12s12_4kv"),  # no S = 4 run was cycled in the paper
    ("w12s12-4kv", [-3, -2, -1, 1, 2, 3], "kvc_w12s12_4kv"),
]


def cycling(n_per_residue: int) -> None:
    print("| zoo model | shifts | paper's R² (corr2) per shift | strict R² per shift | premise | published run: paper's R² "
          "| seconds |")
    print("|---|---|---|---|---|---|---|")
    for name, shifts, run in CYCLING:
        start = time.time()
        result = pi.gate_cycling_profile(pi.load(name), shifts=shifts, n_per_residue=n_per_residue, progress=False)
        t = pi.paper.compare(result, run)
        mine = t.detail[t.detail.model == result.model_label]
        theirs = t.detail[t.detail.model != result.model_label]
        premise = "holds" if result.premise_holds else "FAILS: " + "; ".join(result.premise_notes)[:160]
        print(f"| {name} | {', '.join(f'{d:+d}' for d in mine['shift'])} | "
              f"{', '.join(f'{v:.2f}' for v in mine.paper_r2)} | {', '.join(f'{v:.2f}' for v in mine.r2)} | {premise} | "
              f"{run}: {', '.join(f'{v:.2f}' for v in theirs.paper_r2)} | {time.time() - start:.0f} |", flush=True)


def _units(detail) -> dict[str, str]:
    """Per model of a knockout comparison's detail: its specialized units and the phases each hurts."""
    out = {}
    for model, sub in detail.groupby("model", sort=False):
        hurt = sub[sub.specialized & sub.hurt].groupby(["layer", "kv_head"]).phase.apply(list)
        out[model] = "; ".join(f"L{layer} KV{head}: {', '.join(map(str, phases))}"
                               for (layer, head), phases in hurt.items()) or "none"
    return out


def knockout(names: list[str], n_per_residue: int, n_calibration: int) -> None:
    """Each zoo model's mean-replacement map (every layer, every KV head) beside its counterpart's published
    prefix-padding knockout map, both folded the paper's way (pi.paper.compare): counts, then the units."""
    rows, units = [], []
    for name, run in PAIRS:
        if name not in names:
            continue
        start = time.time()
        result = pi.ablate(pi.load(name), n_per_residue=n_per_residue, n_calibration=n_calibration, progress=False)
        t = pi.paper.compare(result, run)
        a, b = t.to_frame().iloc[0], t.to_frame().iloc[1]
        listed = _units(t.detail)
        rows.append(f"| {name} | {run} | {t.fold} | {a.units} / {b.units} | {a.specialized_units} / {b.specialized_units} "
                    f"| {a.covered} / {b.covered} | {a.worst_change_pct:.1f} / {b.worst_change_pct:.1f} | "
                    f"{a.median_unit_worst_pct:.1f} / {b.median_unit_worst_pct:.1f} | {time.time() - start:.0f} |")
        units.append(f"| {name} | {listed[a.model]} | {run} | {listed[b.model]} |")
        print(rows[-1], flush=True)
    print("\n| zoo model | published run | phases | units (zoo / paper) | specialized units | phases they cover | "
          "worst change % | median unit's worst % | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n| zoo model | its specialized units: phases hurt | published run | its specialized units: phases hurt |")
    print("|---|---|---|---|")
    print("\n".join(units))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-per-residue", type=int, default=72)
    parser.add_argument("--cycling", action="store_true")
    parser.add_argument("--knockout", action="store_true")
    parser.add_argument("--models", nargs="+", default=[name for name, _ in PAIRS],
                        help="with --knockout: the zoo models to ablate (default: every one of PAIRS)")
    parser.add_argument("--n-calibration", type=int, default=256, help="with --knockout: calibration prompts")
    args = parser.parse_args()
    if args.cycling:
        return cycling(args.n_per_residue)
    if args.knockout:
        return knockout(args.models, args.n_per_residue, args.n_calibration)
    print("| zoo model | published run | S | mean % (zoo / paper) | worst phase % | gap pp (24 residues) | "
          "phase gap pp | period | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, run in PAIRS:
        start = time.time()
        model = pi.load(name)
        prof = pi.phase_profile(model, n_per_residue=args.n_per_residue, progress=False)
        t = pi.paper.compare(prof, run).to_frame()
        a, b = t.iloc[0], t.iloc[1]
        period = lambda v: "none" if v != v else str(int(v))  # noqa: E731
        print(f"| {name} | {run} | {a.stride} / {b.stride} | {a.mean_pct:.1f} / {b.mean_pct:.1f} | "
              f"{a.worst_phase_pct:.1f} (phase {a.worst_phase}) / {b.worst_phase_pct:.1f} (phase {b.worst_phase}) | "
              f"{a.gap_pp:.1f} / {b.gap_pp:.1f} | {a.phase_gap_pp:.1f} / {b.phase_gap_pp:.1f} | "
              f"{period(a.period)} / {period(b.period)} | {time.time() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
