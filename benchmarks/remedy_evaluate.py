"""Evaluate the staggered-window remedy over finished twin runs (issue 14), save and print it.

    phaseinterp experiments remedy runs/remedy STEPS W/N   # train: N workers, W = 0..N-1
    python benchmarks/remedy_evaluate.py [--stop-at STEPS] [--out runs/remedy] SEED [SEED ...]
    # the per-layer variant on one-KV-head twins (train with the same three options):
    phaseinterp experiments remedy runs/remedy_layers 1500 W/N --offsets staggered_layers --kv-heads 1 --payload shared
    python benchmarks/remedy_evaluate.py --out runs/remedy_layers --offsets staggered_layers --kv-heads 1 --payload shared 0 1 2

``--stop-at`` (default: the recipe's 1500 steps) is the step every run is evaluated at; the
result is saved to ``OUT/result_stepSTEPS_seeds<seeds>`` and printed: the criteria of
issue 14, learned steps per phase, mean phase curves per variant, final profiles and memory.
"""
import argparse
import json

import torch

from phaseinterp.experiments import compare_remedy

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("seeds", type=int, nargs="+")
parser.add_argument("--stop-at", type=int, default=None, help="evaluate every run at this step (default: the recipe's)")
parser.add_argument("--out", default="runs/remedy")
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--offsets", default="staggered", choices=["staggered", "staggered_layers"])
parser.add_argument("--kv-heads", type=int, default=None)
parser.add_argument("--payload", default=None, choices=["per_slot", "shared"])
args = parser.parse_args()
architecture = {k: v for k, v in (("n_kv_heads", args.kv_heads), ("payload", args.payload)) if v is not None}
torch.set_num_threads(args.threads)
r = compare_remedy(args.out, seeds=tuple(args.seeds), stop_at=args.stop_at, offsets=args.offsets,
                   architecture=architecture or None)
r.save(f"{args.out}/result_step{r.steps}_seeds{''.join(map(str, args.seeds))}")
pd = __import__("pandas")
pd.set_option("display.width", 200)
print(r.summary().to_string())
print(json.dumps(r.criteria(), indent=1, default=str))
print(r.learned_steps().pivot_table(index=["variant", "seed"], columns="phase", values="step"))
pc = r.phase_curves().groupby(["variant", "step", "phase"]).accuracy.mean().unstack("phase")
print(pc.round(2).to_string())
print(r.profiles.pivot_table(index=["variant", "seed"], columns="phase", values="accuracy").round(3).to_string())
print(r.memory.to_string())
