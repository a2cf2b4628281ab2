"""The paper's statistic, movement R², on the shipped models (issue 36, item 1).

    python benchmarks/movement_r2.py run --models w4s4-1kv-shared --out runs/movement_r2
    python benchmarks/movement_r2.py run --profile w4s4-1kv-shared --out runs/movement_r2
    python benchmarks/movement_r2.py table --out runs/movement_r2

``run --models``: for each model, the units of `benchmarks/cycling_table.py` (picked by
`specialized_units`' rule on the selection split, seed 1000, plus the negative control), each
cycled alone on held-out prompts (seed 0) by the shifts +-1..+-3 distinct mod S, saved under
``OUT/<model>/<unit>`` (the same runs as the table of RESULTS, "Gate cycling at unit grain"). ``run --profile``: the
whole-model roll (every layer's gates shifted, ``score="profile"``) on held-out prompts, saved
under ``OUT/<model>/profile``. ``static --model NAME --units L11H0 ...``: the static-part shift of each named unit
(``mode="static"``: only the prompt-independent part of the unit's gate logits moves, the mean logits
over 256 calibration prompts), scored as the roll is (unit contribution, held-out prompts, seed 0),
saved under ``OUT/<model>/<unit>-static`` and printed as a table row. The units are named, not picked
here: they are the picks recorded in RESULTS (the same rule, seed 1000), so the roll and the static
shift are measured on the same units. ``table``: loads every saved result and prints, per row, the
movement R² (`movement_scores`: where the weak spot / the contribution peak went, against the
applied shift) beside the strict profile R² and the identification count.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import phaseinterp as pi  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cycling_table import run_model  # noqa: E402


def _fmt(x: float, digits: int = 2) -> str:
    return ("-inf" if x == -np.inf else "nan") if not np.isfinite(x) else f"{x:.{digits}f}"


def run(args) -> None:
    out = Path(args.out)
    for name in args.profile:
        t0 = time.time()
        model = pi.zoo.load(name)
        result = pi.gate_cycling_profile(model, pi.zoo.task_for(model), n_per_residue=args.n_per_residue,
                                 n_boot=args.n_boot, progress=False)
        result.save(out / name / "profile")
        print(f"# {name} profile roll: {time.time() - t0:.0f} s", flush=True)
    for name in args.models:
        rows = run_model(name, args.n_per_residue, args.n_boot, out)
        print("\n".join(rows), flush=True)


def static(args) -> None:
    from phaseinterp.interventions.gate_shifts import canonical_shifts

    out = Path(args.out)
    model = pi.zoo.load(args.model)
    task = pi.zoo.task_for(model)
    shifts = list(canonical_shifts([-3, -2, -1, 1, 2, 3], model.cfg.stride))
    for label in args.units:
        layer, _, head = label.removeprefix("L").partition("H")
        t0 = time.time()
        result = pi.gate_cycling_unit(model, task, shifts, layers=[int(layer)], kv_heads=[int(head)] if head else None, mode="static", n_per_residue=args.n_per_residue, n_boot=args.n_boot,
                                 progress=False)
        result.save(out / args.model / f"{label}-static")
        print(_row(args.model, f"{label} static-part shift", result), flush=True)
        print(f"# {args.model} {label} static: {time.time() - t0:.0f} s", flush=True)


def chance(stride: int, shifts, observed: float) -> float:
    """P(movement R² >= observed) when each shift's displacement is drawn uniformly and independently
    from the S representatives (every one of the S^D outcomes enumerated): how often a spot that
    moves at random scores this well."""
    import itertools

    from phaseinterp.interventions.cycling_stats import _movement_arrays, representative_shift

    reps = representative_shift(np.arange(stride), stride)
    grid = np.array(list(itertools.product(reps, repeat=len(shifts))))
    r2, _ = _movement_arrays(grid, representative_shift(shifts, stride))
    return float(np.mean(np.nan_to_num(r2, nan=-np.inf) >= observed - 1e-12))


def _row(label: str, what: str, result) -> str:
    s = result.scores
    S = result.stride
    if s["n_shifts"] < 2:
        return (f"| `{label}` | {what} | S={S}, {s['n_shifts']} shift | not defined: one shift distinct mod S is one "
                f"point | - | {_fmt(s['r2_pooled'])} | {s['n_identified']} of {s['n_shifts']} |")
    m = result.movement()
    low, high = m["movement_r2_ci"]
    moves = ", ".join(f"{r.shift:+d}->{r.displacement:+d} [{r.low:+d}, {r.high:+d}]" for r in m["per_shift"].itertuples())
    return (f"| `{label}` | {what} | S={S}, {m['n_points']} shifts | {moves} | **{_fmt(m['movement_r2'])}** "
            f"[{_fmt(low)}, {_fmt(high)}]; r² {_fmt(m['movement_corr2'])} | "
            f"{chance(S, m['per_shift']['shift'].to_numpy(), m['movement_r2']):.3g} | {_fmt(s['r2_pooled'])} | "
            f"{s['n_identified']} of {s['n_shifts']} |")


def table(args) -> None:
    from phaseinterp.interventions.gate_cycling import CyclingResult

    out = Path(args.out)
    rows = ["| model | what was shifted (role; hurt phases, selection split) | points | applied -> measured "
            "displacement [95% CI] | movement R² [95% CI]; r² | chance of >= that R² | strict R² (pooled) | "
            "identified |",
            "|---|---|---|---|---|---|---|---|"]
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        label = folder.name
        if (folder / "profile").exists():
            rows.append(_row(label, "every layer (whole-profile roll)", CyclingResult.load(folder / "profile")))
        picks = {}
        if (folder / "selection").exists():
            picks = {u["label"]: u for u in pi.UnitSelection.load(folder / "selection").units()}
        for unit in sorted(p for p in folder.iterdir() if p.name in picks):
            u = picks[unit.name]
            rows.append(_row(label, f"{unit.name} ({u['role']}; hurt phases {u['hurt_phases']})",
                             pi.UnitCyclingResult.load(unit)))
    print("\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--models", nargs="*", default=[])
    r.add_argument("--profile", nargs="*", default=[])
    r.add_argument("--n-per-residue", type=int, default=72)
    r.add_argument("--n-boot", type=int, default=1000)
    r.add_argument("--out", default="runs/movement_r2")
    r.add_argument("--threads", type=int, default=1)
    st = sub.add_parser("static")
    st.add_argument("--model", required=True)
    st.add_argument("--units", nargs="+", required=True)
    st.add_argument("--n-per-residue", type=int, default=72)
    st.add_argument("--n-boot", type=int, default=1000)
    st.add_argument("--out", default="runs/movement_r2")
    st.add_argument("--threads", type=int, default=1)
    t = sub.add_parser("table")
    t.add_argument("--out", default="runs/movement_r2")
    args = parser.parse_args()
    if args.command == "run":
        torch.set_num_threads(args.threads)
        run(args)
    elif args.command == "static":
        torch.set_num_threads(args.threads)
        static(args)
    else:
        table(args)


if __name__ == "__main__":
    main()
