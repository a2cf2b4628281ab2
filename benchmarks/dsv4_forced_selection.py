"""Do the indexer's misses cause the weak phases? Force the target's entries into top-k (issue 12).

    python benchmarks/dsv4_forced_selection.py [--model dsv4-tiny] [--n-per-residue 72]

`force_target_selection` on the shipped tiny DeepSeek-V4: accuracy by target phase with the
indexer as trained and with the entries holding the target's value forced into its top-k at
the answer position (layer 0's indexer, then both CSA layers' indexers). Wilson 95% intervals.
"""

from __future__ import annotations

import argparse
import time

import torch

import phaseinterp as pi
from phaseinterp.interventions.indexer import force_target_selection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dsv4-tiny")
    parser.add_argument("--n-per-residue", type=int, default=72)
    args = parser.parse_args()
    torch.set_num_threads(1)
    t = time.time()
    model = pi.zoo.load(args.model)
    task = pi.zoo.task_for(model)
    csa = [layer for layer, k in enumerate(model.cfg.layer_types) if k == "compressed_sparse_attention"]
    for layers in (csa[:1], csa):
        res = force_target_selection(model, task, layers=layers, n_per_residue=args.n_per_residue, seed=0)
        print(res)
        print(res.to_frame().round(3).to_string(index=False))
    print("seconds", round(time.time() - t))


if __name__ == "__main__":
    main()
