"""Accuracy by phase for every shipped zoo model (two strides, the DeepSeek kernel, full attention).

    python examples/stride_sweep.py [--out figures/stride_sweep] [--n-per-residue 250] [--models NAME ...] [--quick]

Writes an overlay figure (HTML, plus PNG when kaleido + Chromium are present) and a CSV of
every model's phase profile. ``--quick`` is a smoke run (4 prompts per residue, target positions
not moment-matched): it checks that the script runs; its numbers are not for reading.
"""

import argparse
from pathlib import Path

import pandas as pd

import phaseinterp as pi
from phaseinterp.plot import export, profiles_figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="figures/stride_sweep")
    parser.add_argument("--n-per-residue", type=int, default=250)
    parser.add_argument("--models", nargs="+", default=None, metavar="NAME",
                        help="zoo names to profile (default: every shipped model of both families)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 4 prompts per residue, not moment-matched (checks the script; not for numbers)")
    args = parser.parse_args()
    shipped = pi.zoo.available()
    unknown = [name for name in args.models or () if name not in shipped]
    if unknown:
        parser.error(f"--models {' '.join(unknown)}: not shipped zoo models (shipped: {', '.join(shipped)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profiles = []
    for name in args.models or shipped:
        model = pi.zoo.load(name)
        task = pi.zoo.task_for(model)
        if args.quick:
            profiles.append(pi.phase_profile(model, task.generate(4, seed=0, strict=False), label=name))
        else:
            profiles.append(pi.phase_profile(model, task, n_per_residue=args.n_per_residue, label=name))
        print(name, {k: v for k, v in profiles[-1].to_dict().items() if k in ("mean", "phase_gap", "period")})
    frame = pd.concat([p.phase_frame().assign(model=p.label) for p in profiles])
    frame.to_csv(out / "phase_profiles.csv", index=False)
    fig = profiles_figure(profiles, title="Accuracy by phase across the zoo")
    formats = ["html", "png"] if export.static_export_available() else ["html"]
    print("wrote", [str(p) for p in export.save(fig, out / "stride_sweep", formats=formats)])


if __name__ == "__main__":
    main()
