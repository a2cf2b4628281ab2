"""Full attention (the full-attention twins) through torch's fused kernel, beside the slot path it
replaces while no hook reads the scores or pattern.

    python benchmarks/full_attention_speed.py [--models full full-final deep12-full-equal deep12-full]
                                              [--batch 64] [--repeats 7] [--threads 1]

For each model, on one batch of its own task's prompts (seed 0): the full forward and `last_logits`
(what `phase_profile` reads) with an identity hook on every ``hook_pattern`` (the explicit softmax:
scores ``[batch, head, query, key]``, mask, softmax, mix; what those hooks see) and without (the
default: `scaled_dot_product_attention`), alternated ``--repeats`` times, median ratios; the max
|difference| of the logits between the two.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import torch  # noqa: E402

import phaseinterp as pi  # noqa: E402
from phaseinterp.tasks import resolve_task  # noqa: E402


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["full", "full-final", "deep12-full-equal", "deep12-full"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads {args.threads}, {args.batch} prompts per forward, median of {args.repeats}, "
          f"load {os.getloadavg()[0]:.2f} at start")
    print("| model | layers | forward, slots (s) | forward, fused (s) | ratio | last_logits, slots (s) "
          "| last_logits, fused (s) | ratio | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        model = pi.zoo.load(name).eval()
        if model.cfg.is_compressed:
            raise SystemExit(f"{name} is a compressed model: this compares full-attention paths")
        tokens = resolve_task(model).generate(4, seed=0, strict=False).tokens[: args.batch]
        t = {key: [] for key in ("fs", "ff", "ls", "lf")}
        explicit = [(lambda n: n.endswith("attn.hook_pattern"), lambda p, hook: p)]
        with torch.inference_mode():
            with model.hooks(fwd_hooks=explicit):
                slots = model(tokens)
            diff = float((slots - model(tokens)).abs().max())
            for _ in range(args.repeats):
                for fused in (False, True):
                    with model.hooks(fwd_hooks=[] if fused else explicit):
                        t["ff" if fused else "fs"].append(timed(model, tokens))
                        t["lf" if fused else "ls"].append(timed(model.last_logits, tokens))
        m = {k: statistics.median(v) for k, v in t.items()}
        print(f"| {name} | {model.cfg.n_layers} | {m['fs']:.3f} | {m['ff']:.3f} | {m['fs'] / m['ff']:.2f}x | "
              f"{m['ls']:.3f} | {m['lf']:.3f} | {m['ls'] / m['lf']:.2f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()
