"""Mean-ablation sweep: the fast path vs the naive path vs one clean forward, side by side.

    python benchmarks/ablation_sweep.py [--n-per-residue 4] [--n-calibration 48] [--threads 2] [--rounds 3]

A 12-layer model with 4 KV heads (random weights suffice for timing), T = 512, every
layer x KV head (48 units) over 24 residues. Reports the fast sweep's cost relative to one
clean forward over the same prompts (calibration included; the median over ``--rounds`` back-to-back
pairs, so both share the machine's load) and the naive/fast speed-up, and checks both paths agree.
The ratio's floor is about 1 + n_calibration / n_prompts (1.5 at the defaults): the calibration prompts'
prefills, the prompts' own prefill, then only answer-position steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from phaseinterp import CompressedConfig, CompressedTransformer  # noqa: E402
from phaseinterp.interventions import ablate  # noqa: E402
from phaseinterp.tasks import KeyValueRetrieval  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-per-residue", type=int, default=4)
    parser.add_argument("--n-calibration", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="clean forward + sweep pairs; the median ratio")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = KeyValueRetrieval(seq_len=512, n_records=48, n_demos=4, min_distance=40)
    cfg = CompressedConfig(d_vocab=task.vocab.size, n_ctx=512, d_model=128, n_layers=12, n_heads=8, n_kv_heads=4,
                           d_head=32, d_mlp=512, window=4, stride=4, local_window=16)
    model = CompressedTransformer(cfg)
    prompts = task.generate(args.n_per_residue, seed=0, strict=False)
    n = prompts.tokens.shape[0]
    kwargs = dict(prompts=prompts, n_calibration=args.n_calibration, batch_size=32, progress=False)

    def clean_forward() -> float:
        with torch.inference_mode():
            t0 = time.perf_counter()
            for i in range(0, n, 32):
                model(prompts.tokens[i : i + 32])
            return time.perf_counter() - t0

    def sweep():
        t0 = time.perf_counter()
        return ablate(model, task, **kwargs), time.perf_counter() - t0

    with torch.inference_mode():
        model(prompts.tokens[:32])  # warm-up
    rounds = []  # (clean, sweep) seconds, the two back to back: their ratio shares the machine's load
    for _ in range(args.rounds):
        clean = clean_forward()
        fast, t_fast = sweep()
        rounds.append((clean, t_fast))
    clean, t_fast = (statistics.median(x) for x in zip(*rounds))
    ratio = statistics.median(f / c for c, f in rounds)
    print(f"# ablation_sweep: 12 layers x 4 KV heads = 48 units, T=512, {n} prompts (24 residues x "
          f"{args.n_per_residue}), {args.n_calibration} calibration prompts, {args.threads} threads, "
          f"{args.rounds} rounds")
    print("| path | seconds (median) | / clean forward (median of per-round ratios) |")
    print("|---|---|---|")
    print(f"| one clean forward | {clean:.2f} | 1.00 |")
    print(f"| fast sweep (calibration included) | {t_fast:.2f} | {ratio:.2f} ("
          + ", ".join(f"{f / c:.2f}" for c, f in rounds) + ") |")
    if not args.skip_naive:
        t0 = time.perf_counter()
        naive = ablate(model, task, method="naive", **kwargs)
        t_naive = time.perf_counter() - t0
        print(f"| naive sweep (a hooked forward per unit) | {t_naive:.2f} | {t_naive / clean:.2f} |")
        print(f"\nnaive / fast speed-up: {t_naive / t_fast:.1f}x")
        diff = np.abs(fast.knockout_logit_answer - naive.knockout_logit_answer).max()
        print(f"max |fast - naive| answer logit: {diff:.2e}; correctness identical: "
              f"{bool((fast.knockout_correct == naive.knockout_correct).all())}")


if __name__ == "__main__":
    main()
