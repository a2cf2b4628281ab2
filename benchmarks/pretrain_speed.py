"""Training tokens/s on this machine's CPU: a compressed model beside its full twin, side by side.

    python benchmarks/pretrain_speed.py [--preset cpu-small] [--seq-len 2048] [--rows 2] [--steps 3] [--repeats 3]

Both models run `phaseinterp.train.pretrain.train_step` (the step `pretrain` takes: forward with every
hook point, summed cross-entropy, backward, clipping, AdamW) on the same random token rows, in
alternating order (compressed, full, compressed, ...) so drift in the machine's load hits both. Prints
each repeat's tokens/s and the median ratio compressed / full (> 1: the compressed model trains faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-small")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from phaseinterp.config import preset
    from phaseinterp.models import CompressedTransformer
    from phaseinterp.train.pretrain import PretrainConfig, _optimizer, autocast_for, train_step

    import phaseinterp as pi

    pi.keep_freed_memory()
    tc = PretrainConfig()
    models = {}
    for arch, changes in (("compressed", {}), ("full", {"compression": None})):
        config = preset(args.preset, n_ctx=max(args.seq_len, 2048), **changes)
        model = CompressedTransformer(config).train()
        models[arch] = (model, _optimizer(model, tc))
    vocab = models["compressed"][0].cfg.d_vocab
    rows = torch.randint(0, vocab, (args.rows, args.seq_len + 1), generator=torch.Generator().manual_seed(0))
    autocast = autocast_for(torch.device("cpu"))
    for model, optimizer in models.values():  # warm-up
        train_step(model, optimizer, rows, micro=args.rows, grad_clip=1.0, autocast=autocast)
    rates = {arch: [] for arch in models}
    for _ in range(args.repeats):
        for arch, (model, optimizer) in models.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                train_step(model, optimizer, rows, micro=args.rows, grad_clip=1.0, autocast=autocast)
            rates[arch].append(args.steps * args.rows * args.seq_len / (time.perf_counter() - t0))
    print(f"preset {args.preset}, seq_len {args.seq_len}, {args.rows} rows/step, {torch.get_num_threads()} threads")
    for arch, values in rates.items():
        print(f"  {arch:10s} tokens/s: " + ", ".join(f"{v:,.0f}" for v in values)
              + f"  (median {statistics.median(values):,.0f})")
    ratios = [c / f for c, f in zip(rates["compressed"], rates["full"])]
    print("  compressed / full: " + ", ".join(f"{r:.2f}" for r in ratios) + f"  (median {statistics.median(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
