"""The whole pretraining run on one device, as a GPU run would take it: `pretrain()` with its probe, a
checkpoint, a resume from it, then throughput and peak memory beside `pretrain --plan`'s estimate.

    python benchmarks/pretrain_gpu.py [--preset qwen3-100m] [--seq-len 2048] [--global-batch 8]
                                      [--micro-batch M] [--steps 20] [--fsdp] [--fp32] [--full]
                                      [--activation-checkpointing] [--compile] [--peak-tflops 989]
                                      [--out DIR]
    python benchmarks/pretrain_gpu.py --device cpu          # the smoke run on a machine without CUDA

The corpus is the Python standard library's own documentation (pydoc's topics: on every Python, no
download) with a 4,096-token BPE tokenizer trained on it; the model keeps its preset's vocabulary
(151,936 for the qwen3 presets), so the logits and the memory are the preset's. The run takes
``--steps`` steps with the held-out needle probe and a checkpoint at half way and at the end: the first
call stops (checkpointed) at half way, the second resumes from it (``resume=True``). ``--fsdp`` wraps the
model in FSDP2 on the one device (a world-size-1 group: `PretrainConfig.force_fsdp`), so the sharded
path runs: bf16 parameters and fp32 reductions (FSDP2's `MixedPrecisionPolicy`), DTensor checkpoints.
Prints the loss, the probe, tokens/s of the resumed half, model FLOPs utilisation (6 N + 12 L d T' per
token, T' the keys a query reads: band plus entries for the compressed model, the causal half of the
sequence for the full twin; over ``--peak-tflops``, the device's dense bf16 peak: 989 for an H100/H200
SXM), and CUDA's peak memory beside `phaseinterp.train.plan`'s estimate. Without CUDA (and without
``--device cpu``) it exits 2 and says so; ``--device cpu`` runs the same sequence at the ``tiny``
preset's scale (CPU autocast in bf16 unless ``--fp32``). Never a test: run it by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def attention_keys(config, seq_len: int) -> float:
    """Mean keys per query: the exact band plus the compressed entries, or T/2 without compression."""
    if not config.is_compressed:
        return seq_len / 2
    return min(config.local_window, seq_len / 2) + seq_len / (2 * config.stride)


def corpus(folder: Path) -> tuple[Path, Path]:
    """pydoc's topics as a JSONL corpus and a 4,096-token BPE tokenizer trained on it, in ``folder``."""
    from pydoc_data.topics import topics

    from phaseinterp.train.tokenizer import train_tokenizer

    data = folder / "topics.jsonl"
    paragraphs = [p for k in sorted(topics) for p in topics[k].split("\n\n") if len(p) > 80]
    data.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs))
    tokenizer = folder / "tokenizer"
    if not (tokenizer / "tokenizer.json").is_file():
        train_tokenizer(data, 4096, tokenizer, progress=False)
    return data, tokenizer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--preset", default=None, help="default: qwen3-100m on CUDA, tiny on CPU")
    parser.add_argument("--seq-len", type=int, default=None, help="default: 2048 on CUDA, 64 on CPU")
    parser.add_argument("--global-batch", type=int, default=None, help="rows per step (default: 8 on CUDA, 4 on CPU)")
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--steps", type=int, default=20, help="even; the run stops and resumes at half way")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 on the one device (a world-size-1 group)")
    parser.add_argument("--fp32", action="store_true", help="no bf16 mixed precision")
    parser.add_argument("--full", action="store_true", help="the full-attention twin instead")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--out", default=None, help="the run folder (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.steps % 2:
        print(f"pretrain_gpu: --steps {args.steps} must be even and >= 2 (the run resumes at half way)",
              file=sys.stderr)
        return 2
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # pretrain() places the model on CUDA whenever it sees one
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("pretrain_gpu: no CUDA device on this machine (torch.cuda.is_available() is False); this benchmark "
              "needs one (or --device cpu for the same sequence at the tiny preset's scale)", file=sys.stderr)
        return 2
    from phaseinterp.config import preset
    from phaseinterp.models import parameter_count
    from phaseinterp.train.plan import GIB, plan_memory
    from phaseinterp.train.pretrain import PretrainConfig, pretrain
    from phaseinterp.train.tokenizer import TextTokenizer

    cuda = args.device == "cuda"
    name = args.preset or ("qwen3-100m" if cuda else "tiny")
    seq_len = args.seq_len or (2048 if cuda else 64)
    rows = args.global_batch or (8 if cuda else 4)
    config = preset(name, n_ctx=max(seq_len, 2048), **({"compression": None} if args.full else {}))
    half = args.steps // 2
    tc = PretrainConfig(seq_len=seq_len, global_batch=rows, micro_batch=args.micro_batch, steps=args.steps,
                        lr=3e-4 if cuda else 3e-3, warmup_steps=max(1, half // 2), probe_every=half,
                        probe_per_residue=8 if cuda else 1, checkpoint_every=half, heldout_fraction=0.05,
                        activation_checkpointing=args.activation_checkpointing, compile=args.compile,
                        bf16=not args.fp32, cpu_bf16=not args.fp32, force_fsdp=args.fsdp)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        data, tokenizer = corpus(work)
        config = config.replace(d_vocab=max(config.d_vocab, TextTokenizer(tokenizer).vocab_size))
        plan = plan_memory(config, tc, nproc=1, device_type=args.device, device_gib=None if cuda else 16.0)
        device_name = torch.cuda.get_device_name(0) if cuda else "CPU"
        print(f"{device_name}: {name} {config.label}, {parameter_count(config) / 1e6:.1f}M parameters, {rows} x "
              f"{seq_len} tokens per step, {'FSDP2 (world size 1)' if args.fsdp else 'one process'}, "
              f"{'fp32' if args.fp32 else 'bf16'}; plan {plan.total / GIB:.2f} GiB per device")
        out = Path(args.out) if args.out else work / "run"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        first = pretrain(config, data, tokenizer, tc, out_dir=out, progress=False, stop_after=half)
        assert len(first.curves) == half, first.curves
        t1 = time.time()
        second = pretrain(config, data, tokenizer, tc, out_dir=out, resume=True, progress=False)
        t2 = time.time()
        curves = second.curves
        probes = curves.dropna(subset=["probe_mean"])
        checks = {"steps 1..N": curves.step.tolist() == list(range(1, args.steps + 1)),
                  "probe at half way and the end": probes.step.tolist() == [half, args.steps],
                  "finite loss": bool(curves.loss.notna().all() and (curves.loss < 1e4).all()),
                  "checkpoints": sorted(p.name for p in (out / "checkpoints").glob("step_*"))
                  == [f"step_{half:06d}", f"step_{args.steps:06d}"]}
        resumed = curves[curves.step > half]
        tokens_per_s = float(resumed.tokens_per_s.iloc[1:].median() if len(resumed) > 1 else resumed.tokens_per_s.median())
        flops = 6 * parameter_count(config) + 12 * config.n_layers * config.n_heads * config.d_head * attention_keys(
            config, seq_len)
        print(f"loss {curves.loss.iloc[0]:.3f} -> {curves.loss.iloc[-1]:.3f}; probe mean "
              f"{probes.probe_mean.tolist()}; first call {t1 - t0:.0f} s, resumed call {t2 - t1:.0f} s")
        line = f"{tokens_per_s:,.0f} tokens/s"
        if cuda:
            peak = torch.cuda.max_memory_allocated() / GIB
            line += (f", MFU {100 * tokens_per_s * flops / (args.peak_tflops * 1e12):.1f}%, peak {peak:.1f} GiB "
                     f"(plan {plan.total / GIB:.1f} GiB: {plan.total / GIB / peak:.2f}x)")
        print(line)
        for what, ok in checks.items():
            print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
