"""The CPU pretraining result: a small compressed model and its full twin pretrained on natural text.

    python benchmarks/debian_docs_corpus.py --out runs/corpus/debian-docs.jsonl --max-file-kb 96 --max-mb 40
    phaseinterp tokenizer train --data runs/corpus/debian-docs.jsonl --vocab-size 4096 --out runs/tokenizer-4k
    python benchmarks/pretrain_cpu.py train --arch compressed --needle-fraction 0.0 --out runs/pretrain/cmp-text
    python benchmarks/pretrain_cpu.py train --arch full --needle-fraction 0.0 --out runs/pretrain/full-text
    python benchmarks/pretrain_cpu.py train --arch compressed --needle-fraction 0.5 --out runs/pretrain/cmp-mix
    python benchmarks/pretrain_cpu.py train --arch full --needle-fraction 0.5 --out runs/pretrain/full-mix
    python benchmarks/pretrain_cpu.py train --arch compressed --needle-fraction 1.0 --max-minutes 35 --out runs/pretrain/cmp-needle
    python benchmarks/pretrain_cpu.py train --arch full --needle-fraction 1.0 --max-minutes 35 --out runs/pretrain/full-needle
    python benchmarks/pretrain_cpu.py profile runs/pretrain/cmp-text runs/pretrain/full-text ... [--n-per-residue 64]

Each run is the `cpu-small` preset (4 layers, d_model 128, 4 query heads of 32, 2 KV heads, W = S = 4
scalar gates, shared payload, 16-token local window, tied embeddings) or its full twin
(``compression=None``), one CPU thread, 512-token packed windows, 8 sequences per step, at most
``--max-minutes`` of wall time. ``profile`` evaluates each finished folder on its stored natural-text
needle task (`TextNeedle`, In-sequence Padding, residues mod 24) and prints mean, worst and best phase,
the gap and the period test.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    t = sub.add_parser("train")
    t.add_argument("--arch", choices=("compressed", "full"), required=True)
    t.add_argument("--needle-fraction", type=float, default=0.0)
    t.add_argument("--data", default="runs/corpus/debian-docs.jsonl")
    t.add_argument("--tokenizer", default="runs/tokenizer-4k")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--max-minutes", type=float, default=45.0)
    t.add_argument("--out", required=True)
    t.add_argument("--resume", action="store_true")
    p = sub.add_parser("profile")
    p.add_argument("runs", nargs="+")
    p.add_argument("--n-per-residue", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import phaseinterp as pi

    if args.verb == "train":
        from phaseinterp.config import preset
        from phaseinterp.train.pretrain import PretrainConfig, pretrain

        config = preset("cpu-small", **({"compression": None} if args.arch == "full" else {}))
        tc = PretrainConfig(seq_len=512, global_batch=8, steps=args.steps, lr=3e-3, warmup_steps=50,
                            needle_fraction=args.needle_fraction, probe_every=100, checkpoint_every=100,
                            max_minutes=args.max_minutes)
        result = pretrain(config, args.data, args.tokenizer, tc, out_dir=args.out, resume=args.resume)
        last = result.curves.iloc[-1]
        print(f"{args.out}: {int(last.step)} steps, {int(last.tokens)} tokens, loss {last.loss:.3f}, "
              f"{last.seconds / 60:.1f} min")
        return 0
    pi.keep_freed_memory()
    for run in args.runs:
        model = pi.load(run)
        profile = pi.phase_profile(model, n_per_residue=args.n_per_residue)
        print(run, model.cfg.label, f"step {model.metadata.get('step')}, {model.metadata.get('tokens')} tokens")
        print(profile.summary().to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
