"""Pretraining throughput on one CUDA device: the qwen3-0.6b preset and the ~100M one, for a fixed wall time.

    python benchmarks/pretrain_gpu.py [--presets qwen3-0.6b qwen3-100m] [--seconds 120] [--seq-len 2048]
                                      [--rows 8] [--compile] [--activation-checkpointing] [--full]
                                      [--peak-tflops 989]

Each preset trains on random token rows (throughput does not depend on the text) with the step
`pretrain` takes (`train_step`: bf16 autocast, summed cross-entropy, backward, clipping, AdamW), after
three warm-up steps, until ``--seconds`` have passed. Prints tokens/s, model FLOPs utilisation
(6 N + 12 L d T' per token, with T' the keys a query reads: band plus entries for the compressed
model, the causal half of the sequence for the full twin; over ``--peak-tflops``, the device's dense
bf16 peak: 989 for an H100/H200 SXM) and peak memory. Without CUDA it exits 2 and says so; it is
never a test.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def attention_keys(config, seq_len: int) -> float:
    """Mean keys per query: the exact band plus the compressed entries, or T/2 without compression."""
    if not config.is_compressed:
        return seq_len / 2
    return min(config.local_window, seq_len / 2) + seq_len / (2 * config.stride)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["qwen3-0.6b", "qwen3-100m"])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--full", action="store_true", help="the full-attention twins instead")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("pretrain_gpu: no CUDA device on this machine (torch.cuda.is_available() is False); this benchmark "
              "needs one", file=sys.stderr)
        return 2
    from phaseinterp.config import preset
    from phaseinterp.models import CompressedTransformer, parameter_count
    from phaseinterp.train.pretrain import PretrainConfig, _optimizer, autocast_for, train_step

    device = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name(device)}, seq_len {args.seq_len}, {args.rows} rows/step")
    for name in args.presets:
        config = preset(name, n_ctx=max(args.seq_len, 2048), **({"compression": None} if args.full else {}))
        n_params = parameter_count(config)
        torch.cuda.reset_peak_memory_stats(device)
        model = CompressedTransformer(config).to(device).train()
        model.activation_checkpointing = args.activation_checkpointing
        if args.compile:
            for block in model.blocks:
                block.compile()
        optimizer = _optimizer(model, PretrainConfig())
        rows = torch.randint(0, config.d_vocab, (args.rows, args.seq_len + 1), device=device)
        autocast = autocast_for(device)
        for _ in range(3):
            train_step(model, optimizer, rows, micro=args.rows, grad_clip=1.0, autocast=autocast)
        torch.cuda.synchronize(device)
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            train_step(model, optimizer, rows, micro=args.rows, grad_clip=1.0, autocast=autocast)
            steps += 1
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        tokens_per_s = steps * args.rows * args.seq_len / seconds
        flops_per_token = 6 * n_params + 12 * config.n_layers * config.n_heads * config.d_head * attention_keys(
            config, args.seq_len)
        mfu = tokens_per_s * flops_per_token / (args.peak_tflops * 1e12)
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        print(f"{name:12s} {config.label:22s} {n_params / 1e6:7.1f}M params  {tokens_per_s:12,.0f} tokens/s  "
              f"MFU {100 * mfu:5.1f}%  peak {peak:6.1f} GiB  ({steps} steps in {seconds:.0f} s)")
        del model, optimizer
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
