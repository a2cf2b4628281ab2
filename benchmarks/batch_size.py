"""Prompts per forward pass: the default batch of `phase_profile` and gate cycling (64) beside
the sizes it replaces (256 and 128) and a smaller one (32).

    python benchmarks/batch_size.py [--models w4s4 w8s8-4kv full deep12-w8s8-1kv-shared-equal deep12-full-equal dsv4-tiny]
                                    [--prompts 512] [--sizes 32 64 128 256] [--repeats 5] [--threads 1]
                                    [--keep-freed-memory]

For each zoo model: the answer logits (`last_logits`, what `phase_profile` and whole-profile gate
cycling read) of the same ``--prompts`` prompts (its own task, seed 0), run in batches of each
size, the sizes alternated ``--repeats`` times (the machine is shared); the median time of each
size is printed as a ratio to the 64-prompt batches (> 1: slower than 64). The logits of every
size are compared with those of size 64 (max |difference|; 0 means bit-identical).

Why a size matters on a CPU: a batch's attention scores and MLP intermediates are
``batch x heads x positions x slots`` floats. Under glibc's default allocator, blocks above its
mmap threshold are mapped fresh and page-faulted in on every allocation, and the larger the batch
the more of them (`benchmarks/allocator.py`); ``--keep-freed-memory`` compares the sizes without
that (as the command line and the tests run).
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

DEFAULT_MODELS = ("w4s4", "w8s8-4kv", "full", "deep12-w8s8-1kv-shared-equal", "deep12-full-equal", "dsv4-tiny")


def load(name: str):
    from phaseinterp.zoo import deepseek_v4 as hf_zoo

    return hf_zoo.load(name) if name in hf_zoo.available() else pi.zoo.load(name)


@torch.inference_mode()
def answer_logits(model, tokens: torch.Tensor, size: int) -> torch.Tensor:
    return torch.cat([model.last_logits(tokens[i : i + size]) for i in range(0, tokens.shape[0], size)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="call phaseinterp.keep_freed_memory() first (default: glibc's defaults)")
    args = parser.parse_args()
    if args.keep_freed_memory:
        print(f"keep_freed_memory: {pi.keep_freed_memory()}")
    if 64 not in args.sizes:
        parser.error("--sizes must include 64, the default every ratio is taken against")
    torch.set_num_threads(args.threads)
    print(f"torch threads {args.threads}, {args.prompts} prompts, load {os.getloadavg()[0]:.2f} at start")
    print(f"{'model':34s} " + " ".join(f"{s:>8d}" for s in args.sizes) + "   (time / time at 64; max |diff| to 64)")
    for name in args.models:
        model = load(name).eval()
        batch = resolve_task(model, None).generate(72, seed=0)
        answer_pos = int(batch.answer_pos[0])
        tokens = batch.tokens[: args.prompts, : answer_pos + 1]
        times: dict[int, list[float]] = {s: [] for s in args.sizes}
        out: dict[int, torch.Tensor] = {}
        for size in args.sizes:  # warm-up, and the logits to compare
            out[size] = answer_logits(model, tokens, size)
        for _ in range(args.repeats):
            for size in args.sizes:
                start = time.perf_counter()
                answer_logits(model, tokens, size)
                times[size].append(time.perf_counter() - start)
        base = statistics.median(times[64])
        ratios = " ".join(f"{statistics.median(times[s]) / base:8.2f}" for s in args.sizes)
        diff = max((out[s] - out[64]).abs().max().item() for s in args.sizes)
        print(f"{name:34s} {ratios}   max|diff| {diff:.1e}   (64: {base:.2f} s)")


if __name__ == "__main__":
    main()
