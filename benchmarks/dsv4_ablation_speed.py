"""All-layer mean-ablation sweep on the tiny DeepSeek-V4 vs one clean forward: fast and naive side by side.

    python benchmarks/dsv4_ablation_speed.py [--model dsv4-tiny] [--n-per-residue 24]
                                             [--n-calibration 64] [--repeats 3] [--threads 1]

Issue 21 (item 3): ``phaseinterp.ablate(model)`` over every layer's KV head of ``dsv4-tiny``
(the cached forward: a prefill, a step, steps over forks of the cache) must cost at most 2x one clean
forward over the same prompts; the naive path (one hooked full forward per unit,
``method="naive"``) is timed beside it. Both sweeps include their calibration forward. The three
are timed in turn ``--repeats`` times (the machine is shared; alternating keeps them under the
same load) and the medians of the per-repeat ratios are reported, with the largest fast-vs-naive
difference of the knockout answer log-probabilities.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import phaseinterp as pi  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dsv4-tiny", help="a shipped HF DeepSeek-V4 zoo name")
    parser.add_argument("--n-per-residue", type=int, default=24)
    parser.add_argument("--n-calibration", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    for name in ("n_per_residue", "n_calibration", "batch_size", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    torch.set_num_threads(args.threads)
    model = pi.zoo.load(args.model)
    task = pi.zoo.task_for(model)
    prompts = task.generate(args.n_per_residue, seed=0, strict=False)  # timing only: placement need not be exact
    n, bs = prompts.tokens.shape[0], args.batch_size

    def clean_forward() -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i in range(0, n, bs):
                model(prompts.tokens[i : i + bs])
        return time.perf_counter() - t0

    def sweep(method: str):
        t0 = time.perf_counter()
        result = pi.ablate(model, task, layer=None, prompts=prompts, n_calibration=args.n_calibration,
                           batch_size=bs, method=method, progress=False)
        return time.perf_counter() - t0, result

    clean_forward()  # warm-up
    rows = []
    for _ in range(args.repeats):
        clean = clean_forward()
        fast, fast_result = sweep("fast")
        naive, naive_result = sweep("naive")
        rows.append((clean, fast, naive))
        print(f"clean {clean:.2f} s  fast sweep {fast:.2f} s ({fast / clean:.2f}x)  "
              f"naive sweep {naive:.2f} s ({naive / clean:.2f}x)", flush=True)
    diff = float(np.abs(fast_result.knockout_logit_answer - naive_result.knockout_logit_answer).max())
    units = len(fast_result.units)
    print(f"\n{args.model}: {n} prompts x {prompts.tokens.shape[1]} tokens, {units} units (every layer's KV head), "
          f"batch {bs}, {args.threads} thread(s), calibration {args.n_calibration} prompts in each sweep")
    print(f"median clean forward      {statistics.median(r[0] for r in rows):.2f} s")
    print(f"median fast sweep         {statistics.median(r[1] for r in rows):.2f} s   "
          f"ratio to clean {statistics.median(r[1] / r[0] for r in rows):.2f}x")
    print(f"median naive sweep        {statistics.median(r[2] for r in rows):.2f} s   "
          f"ratio to clean {statistics.median(r[2] / r[0] for r in rows):.2f}x")
    print(f"naive / fast              {statistics.median(r[2] / r[1] for r in rows):.2f}x")
    print(f"max |fast - naive| knockout answer logit: {diff:.2e}; knockout correctness equal: "
          f"{bool((fast_result.knockout_correct == naive_result.knockout_correct).all())}")


if __name__ == "__main__":
    main()
