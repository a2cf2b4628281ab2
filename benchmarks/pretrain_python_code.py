"""The controlled claim on natural text, on these CPUs: 2-layer models at `cpu-small` widths pretrained
on Python source, W = S = 4, its full-attention twin and a W = S = 8 arm (RESULTS, "Natural text:
Python source", states the pre-registered outcomes).

    python benchmarks/python_source_corpus.py --out ~/phaseinterp-runs/corpus/python-source.jsonl
    phaseinterp tokenizer train --data ~/phaseinterp-runs/corpus/python-source.jsonl --vocab-size 4096 \\
        --out ~/phaseinterp-runs/tokenizer-py-4k
    python benchmarks/pretrain_python_code.py train --root ~/phaseinterp-runs/python-code   # resumable
    python benchmarks/pretrain_python_code.py status --root ~/phaseinterp-runs/python-code

``train`` runs the arms round-robin, ``--chunk-steps`` optimizer steps at a time on one CPU thread,
in the order of ``--arms`` in pairs (the compressed model and its twin advance together, so their
curves are compared at matched token counts), and resumes every arm from its newest checkpoint: stop
it at any time and rerun the same command. Each arm is a `phaseinterp.train.pretrain` run folder
(``ROOT/ARM``) with a snapshot kept every ``--keep-every`` steps; keep ``ROOT`` outside a git work
tree. 256-token sequences, 8 per step, 24,000 steps (49.2M tokens, twice the predicted induction-head
formation point for this batch and context), no needle rows (pure text), the held-out needle probe
every 500 steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ARMS = {  # arm name -> (architecture overrides of cpu-small, seed)
    "w4s4-s0": ({}, 0),
    "full-s0": ({"compression": None}, 0),
    "w4s4-s1": ({}, 1),
    "full-s1": ({"compression": None}, 1),
    "w8s8-s0": ({"window": 8, "stride": 8}, 0),
}
DEFAULT_ORDER = "w4s4-s0,full-s0,w4s4-s1,full-s1,w8s8-s0"


def recipe(steps: int, seed: int, keep_every: int):
    from phaseinterp.train.pretrain import PretrainConfig

    return PretrainConfig(seq_len=256, global_batch=8, steps=steps, seed=seed, lr=3e-3, warmup_steps=200,
                          needle_fraction=0.0, probe_every=500, probe_per_residue=8, checkpoint_every=500,
                          keep_every=keep_every, progress_every=100)


def architecture(arm: str, d_vocab: int):
    from phaseinterp.config import preset

    overrides, _ = ARMS[arm]
    return preset("cpu-small", n_layers=2, d_vocab=d_vocab, **overrides)


def done_steps(folder: Path) -> int:
    from phaseinterp.train.compressed import latest_checkpoint

    latest = latest_checkpoint(folder / "checkpoints") if (folder / "checkpoints").is_dir() else None
    return int(latest.name[5:]) if latest is not None else 0


def train(args) -> int:
    from phaseinterp.train.pretrain import pretrain
    from phaseinterp.train.tokenizer import TextTokenizer

    root = Path(os.path.expanduser(args.root))
    order = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in order if a not in ARMS]
    if unknown:
        print(f"--arms: unknown arms {unknown}; valid: {sorted(ARMS)}", file=sys.stderr)
        return 2
    d_vocab = TextTokenizer(os.path.expanduser(args.tokenizer)).vocab_size
    pairs = [order[i : i + 2] for i in range(0, len(order), 2)]
    for pair in pairs:
        while True:
            pending = [a for a in pair if done_steps(root / a) < args.steps]
            if not pending:
                break
            for arm in pending:
                t0 = time.time()
                result = pretrain(architecture(arm, d_vocab), os.path.expanduser(args.data),
                                  os.path.expanduser(args.tokenizer), recipe(args.steps, ARMS[arm][1], args.keep_every),
                                  out_dir=root / arm, resume=True, progress=False, stop_after=args.chunk_steps)
                last = result.curves.iloc[-1]
                probe = "" if "probe_mean" not in last or last.isna().get("probe_mean", True) else \
                    f", probe mean {last.probe_mean:.3f} gap {last.probe_gap:.3f}"
                print(f"{time.strftime('%H:%M:%S')} {arm}: step {int(last.step)}, {int(last.tokens) / 1e6:.1f}M tokens, "
                      f"loss {last.loss:.3f}{probe} ({time.time() - t0:.0f} s)", flush=True)
    return 0


def status(args) -> int:
    import pandas as pd

    root = Path(os.path.expanduser(args.root))
    for arm in ARMS:
        curves = root / arm / "curves.csv"
        if not curves.is_file():
            print(f"{arm}: not started")
            continue
        frame = pd.read_csv(curves)
        last = frame.iloc[-1]
        probes = frame.dropna(subset=["probe_mean"]) if "probe_mean" in frame else frame.iloc[:0]
        probe = "" if probes.empty else f", probe mean {probes.iloc[-1].probe_mean:.3f} gap {probes.iloc[-1].probe_gap:.3f}"
        print(f"{arm}: step {int(last.step)}, {last.tokens / 1e6:.1f}M tokens, loss {frame.loss.tail(100).mean():.3f}, "
              f"{frame.tokens_per_s.tail(100).median():.0f} tokens/s{probe}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    t = sub.add_parser("train")
    t.add_argument("--root", required=True, help="the runs' folder, outside the work tree")
    t.add_argument("--data", default="~/phaseinterp-runs/corpus/python-source.jsonl")
    t.add_argument("--tokenizer", default="~/phaseinterp-runs/tokenizer-py-4k")
    t.add_argument("--arms", default=DEFAULT_ORDER, help=f"comma-separated, run in pairs (default {DEFAULT_ORDER})")
    t.add_argument("--steps", type=int, default=24000)
    t.add_argument("--chunk-steps", type=int, default=500)
    t.add_argument("--keep-every", type=int, default=1000)
    t.add_argument("--threads", type=int, default=1)
    s = sub.add_parser("status")
    s.add_argument("--root", required=True)
    args = parser.parse_args(argv)
    if args.verb == "train":
        torch.set_num_threads(args.threads)
        return train(args)
    return status(args)


if __name__ == "__main__":
    sys.exit(main())
