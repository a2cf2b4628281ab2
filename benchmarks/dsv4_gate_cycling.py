"""Gate cycling on a tiny HF DeepSeek-V4: roll the CSA layers' position_bias, watch the weak phase move (issue 12).

    python benchmarks/dsv4_gate_cycling.py [--model dsv4-tiny] [--n-per-residue 72]

`gate_cycling_profile` with shifts 1..S-1 on the CSA layers only (both halves of each slot move
together; the HCA layer is left alone). Prints accuracy per shift x phase and the scores
(R^2 of the parameter-free prediction A_d(r) = A_0((r - d) mod S), boundary excluded; with
S = 4 each per-shift score rests on 3 points).
"""

from __future__ import annotations

import argparse
import time

import torch

import phaseinterp as pi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dsv4-tiny")
    parser.add_argument("--n-per-residue", type=int, default=72)
    args = parser.parse_args()
    torch.set_num_threads(1)
    t = time.time()
    model = pi.zoo.load(args.model)
    task = pi.zoo.task_for(model)
    S = model.cfg.stride
    csa = [layer for layer, k in enumerate(model.cfg.layer_types) if k == "compressed_sparse_attention"]
    res = pi.gate_cycling_profile(model, task, shifts=list(range(1, S)), layers=csa, n_per_residue=args.n_per_residue,
                          n_boot=200, progress=False)
    print(res.phase_accuracy().round(3).to_string())
    print(res.scores["per_shift"].round(3).to_string(index=False))
    print({k: v for k, v in res.scores.items() if k != "per_shift"})
    print("seconds", round(time.time() - t))


if __name__ == "__main__":
    main()
