"""All-layer mean-ablation sweep on the shipped deep model vs one clean forward, side by side.

    python benchmarks/deep_ablation.py [--model deep12-w8s8-1kv-shared] [--n-per-residue 72]
                                       [--n-calibration 64] [--repeats 3] [--threads 1]

Issue 13: ``phaseinterp.ablate(model)`` over every layer of the 12-layer zoo model must
cost at most 2x one clean forward over the same prompts (calibration included). The two
are timed alternately ``--repeats`` times (the machine is shared; alternating keeps both
under the same load) and the median of the per-repeat ratios is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import torch  # noqa: E402

import phaseinterp as pi  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deep12-w8s8-1kv-shared",
                        help="zoo name or checkpoint directory (timing does not depend on how well it is trained)")
    parser.add_argument("--n-per-residue", type=int, default=72)
    parser.add_argument("--n-calibration", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    for name in ("n_per_residue", "n_calibration", "batch_size", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    torch.set_num_threads(args.threads)
    if os.path.isdir(args.model):
        model = pi.CompressedTransformer.from_pretrained(args.model).eval()
    else:
        model = pi.zoo.load(args.model)
    task = pi.zoo.task_for(model)
    prompts = task.generate(args.n_per_residue, seed=0, strict=False)  # timing only: placement need not be exact
    n = prompts.tokens.shape[0]
    bs = args.batch_size

    def clean_forward() -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i in range(0, n, bs):
                model(prompts.tokens[i : i + bs])
        return time.perf_counter() - t0

    def sweep() -> tuple[float, object]:
        t0 = time.perf_counter()
        result = pi.ablate(model, task, layer=None, prompts=prompts, n_calibration=args.n_calibration,
                           batch_size=bs, progress=False)
        return time.perf_counter() - t0, result

    clean_forward()  # warm-up
    cleans, sweeps, ratios = [], [], []
    for _ in range(args.repeats):
        c = clean_forward()
        s, result = sweep()
        cleans.append(c)
        sweeps.append(s)
        ratios.append(s / c)
    cfg = model.cfg
    print(f"# deep_ablation: {args.model}, {cfg.n_layers} layers x {cfg.n_kv_heads} KV head(s) = "
          f"{len(result.units)} units, T={prompts.tokens.shape[1]}, {n} prompts ({task.residue_modulus} residues x "
          f"{args.n_per_residue}), {args.n_calibration} calibration prompts, {args.threads} thread(s), "
          f"median of {args.repeats} alternating repeats")
    print("| path | seconds (median) | / clean forward (median of per-repeat ratios) |")
    print("|---|---|---|")
    print(f"| one clean forward | {statistics.median(cleans):.3f} | 1.00 |")
    print(f"| all-layer sweep (calibration included) | {statistics.median(sweeps):.3f} | "
          f"{statistics.median(ratios):.2f} |")
    print(f"per-repeat ratios: {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
