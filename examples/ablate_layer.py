"""Per-KV-head mean replacement on layer 9 of the paper-depth zoo model, with the head x phase map.

    python examples/ablate_layer.py [--model deep12-w8s8-1kv-shared-equal] [--n-per-residue N]
                                    [--layer L ...] [--all-layers] [--out figures/ablate] [--quick]

The call the toolkit is built around, literally::

    model = phaseinterp.zoo.load("deep12-w8s8-1kv-shared-equal")   # 12 layers, one KV head, W = S = 8
    result = phaseinterp.ablate(model, layer=9)

The default model is the paper-depth run's equal-training snapshot (step 1000, the zoo's rule):
the one with a phase structure to take apart (period 8, phases 5 and 6 weak). Its final step
(``--model deep12-w8s8-1kv-shared``, step 3000) is at >= 99% on every phase, so knockouts there
have no weak phase to explain. ``--layer 11`` shows the unit that serves phases 5 and 6.

``--layer`` ablates further layers one call each; ``--all-layers`` adds the sweep over every layer (one call, ``layer=None``) and its
specialization table: for each (layer, KV head) the adjacent phases its knockout hurts by
<= -50%.

``--quick`` is a smoke run (4 prompts per residue, not moment-matched; 48 calibration prompts):
it checks that the script runs; its numbers are not for reading.
"""

import argparse
from pathlib import Path

import phaseinterp
from phaseinterp.plot import export


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deep12-w8s8-1kv-shared-equal",
                        help="zoo model with at least 10 layers (default: deep12-w8s8-1kv-shared-equal)")
    parser.add_argument("--n-per-residue", type=int, default=None, help="prompts per residue (default: ablate's)")
    parser.add_argument("--layer", type=int, nargs="*", default=[], help="further layers to ablate after layer 9")
    parser.add_argument("--all-layers", action="store_true", help="also sweep every layer")
    parser.add_argument("--out", default="figures/ablate")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 4 prompts per residue, not moment-matched (checks the script; not for numbers)")
    args = parser.parse_args()
    model = phaseinterp.zoo.load(args.model)
    if model.cfg.n_layers <= 9:
        parser.error(f"--model {args.model} has {model.cfg.n_layers} layers; layer 9 needs at least 10 "
                     "(use deep12-w8s8-1kv-shared-equal)")

    if args.quick:
        size = {"prompts": phaseinterp.zoo.task_for(model).generate(4, seed=0, strict=False), "n_calibration": 48}
    else:
        size = {} if args.n_per_residue is None else {"n_per_residue": args.n_per_residue}
    if not size:
        result = phaseinterp.ablate(model, layer=9)  # the literal call
    else:
        result = phaseinterp.ablate(model, layer=9, **size)
    print(f"{args.model}: clean accuracy by phase")
    print(result.clean.round(3).to_string())
    print("\nlayer 9: relative change of accuracy (%) when each KV head is mean-replaced")
    print(result.relative_change.round(1).to_string())

    out = Path(args.out)
    result.save(out / "layer9")
    result.to_frame().to_csv(out / "layer9.csv", index=False)
    formats = ["html", "png"] if export.static_export_available() else ["html"]
    print("wrote", [str(p) for p in export.save(result.plot(), out / "layer9_heatmap", formats=formats)])

    for layer in args.layer:
        other = phaseinterp.ablate(model, layer=layer, **size)
        print(f"\nlayer {layer}: relative change (%)")
        print(other.relative_change.round(1).to_string())
        other.to_frame().to_csv(out / f"layer{layer}.csv", index=False)
        export.save(other.plot(), out / f"layer{layer}_heatmap", formats=["html"])

    if args.all_layers:
        sweep = phaseinterp.ablate(model, **size)
        print("\nall layers: relative change (%)")
        print(sweep.relative_change.round(1).to_string())
        print("\nspecialization (adjacent phases hurt by <= -50%)")
        print(sweep.specialization().to_string(index=False))
        sweep.save(out / "all_layers")
        sweep.to_frame().to_csv(out / "all_layers.csv", index=False)
        print("wrote", [str(p) for p in export.save(sweep.plot(), out / "all_layers_heatmap", formats=formats)])


if __name__ == "__main__":
    main()
