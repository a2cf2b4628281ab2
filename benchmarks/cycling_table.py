"""The paper's five-model gate-cycling table, at the grain of one unit (issue 20).

    python benchmarks/cycling_table.py                       # every model below, 72 prompts per residue
    python benchmarks/cycling_table.py --models w4s4-1kv-shared dsv4-tiny
    python benchmarks/cycling_table.py --models runs/deep12_seed1/deep12-w8s8-1kv-shared/snapshot_000800

For each model: `specialized_units` picks units by the rule fixed in code on a selection split
(seed 1000: knockout hurts 1..3 adjacent phases, Holm-significant, <= -50% relative; plus one
negative control, a cyclable unit hurt on no phase), then `gate_cycling_unit(...)`
cycles each picked unit alone on held-out prompts (seed 0) for the shifts +-1..+-3 (distinct
mod S: -3..3 at S = 8; -1, 1, 2 at S = 4; 1 at S = 2) and scores its own contribution (answer
log-prob) against ``C_0((r - d) mod S)``. A model whose gates cannot be cycled meaningfully
(payload maps per slot, uniform gates, no compression) gets a row that says why. Prints a
markdown table (benchmarks/RESULTS.md, "Gate cycling at unit grain") and saves every result under --out.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

import phaseinterp as pi
from phaseinterp.interventions.gate_shifts import canonical_shifts, cycling_fitness

MODELS = ("deep12-w8s8-1kv-shared-equal", "deep12-w8s8-1kv-shared-seed1-equal", "w4s4-1kv-shared",
          "w8s4-deepseek", "dsv4-tiny", "dsv4.1-tiny", "w8s8-4kv")


def _load(name: str):
    return pi.zoo.load(name) if not Path(name).exists() else pi.models.CompressedTransformer.from_pretrained(name)


def _fmt(x: float) -> str:
    return "nan" if not np.isfinite(x) else f"{x:.2f}"


def run_model(name: str, n_per_residue: int, n_boot: int, out: Path) -> list[str]:
    t0 = time.time()
    model = _load(name)
    label = Path(name).name if Path(name).exists() else name
    task = pi.zoo.task_for(model)
    ok, why = cycling_fitness(model)
    if not ok:
        return [f"| `{label}` | - | - | not cycled: {why} | | | | |"]
    S = model.cfg.stride
    shifts = list(canonical_shifts([-3, -2, -1, 1, 2, 3], S))
    selection = pi.specialized_units(model, task, n_per_residue=n_per_residue, progress=False)
    selection.save(out / label / "selection")
    units = selection.units()
    if not [u for u in units if u["role"] == "specialized"]:
        hurt = {f"L{r.layer}H{r.kv_head}": list(r.hurt_phases) for r in selection.table.itertuples()}
        units_note = f"no unit passes the rule (hurt phases per unit on the selection split: {hurt})"
        rows = [f"| `{label}` | - | - | {units_note} | | | | |"]
    else:
        rows = []
    for unit in units:
        result = pi.gate_cycling_unit(model, task, shifts, layers=unit["layers"], kv_heads=unit["kv_heads"],
                                 n_per_residue=n_per_residue, n_boot=n_boot, progress=False)
        result.save(out / label / unit["label"])
        s = result.scores
        ps = s["per_shift"].set_index("shift")
        low, high = result.intervals().loc["r2_pooled"]
        phases = unit["hurt_phases"]
        r2 = ", ".join(f"{d:+d}: {_fmt(ps.loc[d, 'r2'])}" for d in ps.index)
        best = ", ".join(f"{d:+d}->{int(ps.loc[d, 'best']):+d}" for d in ps.index)
        rows.append(f"| `{label}` | {unit['label']} ({unit['role']}; hurt phases {phases}) | S={S}, "
                    f"{len(ps)} shifts x {S} phases | {r2} | {_fmt(s['r2_pooled'])} [{_fmt(low)}, {_fmt(high)}] | "
                    f"{s['n_identified']} of {s['n_shifts']} ({best}) | {s['identification_p']:.2g} | "
                    f"{np.mean(ps['identification_null']):.3f} |")
    print(f"# {label}: {time.time() - t0:.0f} s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--n-per-residue", type=int, default=72)
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--out", default="runs/cycling_table")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    header = ["| model | unit (role; phases its knockout hurts, selection split) | points | R² per shift (all S phases) "
              "| pooled R² [95% CI] | identified (applied->best) | joint p | chance per shift |",
              "|---|---|---|---|---|---|---|---|"]
    rows = []
    for name in args.models:
        rows += run_model(name, args.n_per_residue, args.n_boot, out)
        (out / "table.md").parent.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text("\n".join(header + rows) + "\n")
    print("\n".join(header + rows))


if __name__ == "__main__":
    main()
