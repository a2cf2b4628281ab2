"""Per-KV-head mean replacement on one layer (or all), with the head x phase heatmap.

    python examples/ablate_layer.py [--model w4s4] [--layer 1] [--out figures/ablate]
"""

import argparse
from pathlib import Path

import phaseinterp as pi
from phaseinterp.plot import export


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="w4s4")
    parser.add_argument("--layer", type=int, nargs="*", default=None, help="layers (default: all)")
    parser.add_argument("--n-per-residue", type=int, default=72)
    parser.add_argument("--out", default="figures/ablate")
    args = parser.parse_args()
    model = pi.zoo.load(args.model)
    result = pi.ablate(model, layer=args.layer or None, n_per_residue=args.n_per_residue)
    print(result.relative_change.round(1).to_string())
    print(result.specialization().to_string(index=False))
    out = Path(args.out)
    result.save(out / "result")
    result.to_frame().to_csv(out / "ablation.csv", index=False)
    formats = ["html", "png"] if export.static_export_available() else ["html"]
    print("wrote", [str(p) for p in export.save(result.plot(), out / "heatmap", formats=formats)])


if __name__ == "__main__":
    main()
