"""How the paper-depth recipe was found (issue 13): the shared schedule, the fork, the diagnosis.

    # 1. the deep pair under the SHARED 1500-step schedule (the zoo recipe before DEEP_TRAIN):
    python benchmarks/deep_schedule.py train runs/deep12_1500 --steps 1500 [--model deep12-w8s8-1kv-shared]
    #    a second seed of the deep pair with the DEEP_TRAIN schedule (one process per model):
    python benchmarks/deep_schedule.py train runs/deep12_seed1 --steps 3000 --seed 1 --model deep12-w8s8-1kv-shared
    # 2. the fork: resume that run's step-1500 checkpoint under a longer schedule (here 3000
    #    steps, so the curriculum's easy stage lasts to step 1800), stop at --stop:
    python benchmarks/deep_schedule.py fork runs/deep_fork3000 --from runs/deep12_1500/deep12-w8s8-1kv-shared \\
        --steps 3000 --stop 1800
    # 3. what a snapshot has learned: probe curve of a run, copying on periodic rows by block
    #    length (beyond the 16-token local window the source is only reachable through the
    #    compressed entries) and answer accuracy on easy- and final-stage task rows:
    python benchmarks/deep_schedule.py diagnose runs/deep12_1500/deep12-w8s8-1kv-shared/snapshot_001000

One thread (the zoo's setting); the runs are deterministic given the thread count. Runs are
resumable (rerun the same command). The fork deliberately changes the schedule of a resumed
run, which `train` otherwise refuses.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

import torch

from phaseinterp import zoo


def _config(name: str, steps: int, seed: int = 0):
    e = zoo.entry(name)
    tc = dataclasses.replace(e.train_config(), steps=steps, snapshot_steps=tuple(range(100, steps + 1, 100)),
                             seed=seed)
    task = e.task_object()
    return e, task, tc


def train_cmd(args) -> None:
    from phaseinterp.train import train

    for name in args.model:
        e, task, tc = _config(name, args.steps, args.seed)
        config = e.model_config(task.vocab.size).replace(seed=args.seed)
        train(config, task, train_config=tc, out_dir=Path(args.out) / name, resume=True, progress=True,
              stop_after=args.stop, metadata={"experiment": f"deep schedule, steps={args.steps}, seed={args.seed}"})


def fork_cmd(args) -> None:
    import phaseinterp.train.compressed as T

    source_run = Path(getattr(args, "from"))
    source = source_run / "checkpoints" / f"step_{args.at:06d}"
    if not source.is_dir():
        raise SystemExit(f"--from {source_run}: no checkpoint {source}")
    e, task, tc = _config(args.model[0], args.steps)
    out = Path(args.out)
    ckpts = out / "checkpoints"
    if not (ckpts / "LATEST").exists():
        ckpts.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, ckpts / source.name)
        (ckpts / "LATEST").write_text(source.name)
    T._check_same_run = lambda *a, **k: None  # a deliberate fork: the schedule changes
    print(f"fork at step {args.at}: lr {tc.lr_at(args.at):.2e}, stage {tc.stage_at(args.at)}", flush=True)
    T.train(e.model_config(task.vocab.size), task, train_config=tc, out_dir=out, resume=True, progress=True,
            stop_after=args.stop - args.at, metadata={"experiment": f"fork of {source_run} at {args.at}"})


def diagnose_cmd(args) -> None:
    import pandas as pd

    from phaseinterp.models import CompressedTransformer
    from phaseinterp.train import periodic_rows

    path = Path(args.snapshot)
    curves = path.parent / "curves.csv"
    if curves.is_file():
        c = pd.read_csv(curves)
        print("probe mean by step:", c.groupby("step").accuracy.mean().round(3).to_dict())
    model = CompressedTransformer.from_pretrained(path).eval()
    task = zoo.entry(args.model[0]).task_object()
    g = torch.Generator().manual_seed(7)
    by_block = {}
    with torch.inference_mode():
        for b in (4, 8, 12, 16, 20, 24, 32, 40, 48):
            tokens, targets, mask = periodic_rows(32, 128, task.vocab.size, (b, b), g, low=len(task.vocab.specials))
            ok = (model(tokens).argmax(-1) == targets) & mask
            later = mask & (torch.arange(128) >= 2 * b)  # from the second repeat on
            by_block[b] = round(float(ok[later].float().mean()), 3)
    print(f"{path.name}: periodic-row copying by block length:", by_block)
    for stage, kw in (("easy-stage", dict(n_records=(4, 24), n_queries=None)), ("final-stage", dict(n_queries=8))):
        rows = task.sample_train(64, 99, **kw)
        with torch.inference_mode():
            pred = model(rows.tokens).argmax(-1)
        m = rows.answer_mask
        print(f"{stage} task answer accuracy:", round(float((pred[m] == rows.targets[m]).float().mean()), 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train")
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--model", nargs="+", default=["deep12-w8s8-1kv-shared", "deep12-full"])
    p.add_argument("--seed", type=int, default=0, help="model and data seed (the zoo's: 0)")
    p.add_argument("--stop", type=int, default=None, help="stop after this many steps (the schedule stays --steps)")
    p = sub.add_parser("fork")
    p.add_argument("out")
    p.add_argument("--from", required=True, help="the run directory to fork")
    p.add_argument("--at", type=int, default=1500, help="the checkpoint step to fork from")
    p.add_argument("--steps", type=int, default=3000, help="the fork's schedule length")
    p.add_argument("--stop", type=int, default=1800, help="stop at this step")
    p.add_argument("--model", nargs=1, default=["deep12-w8s8-1kv-shared"])
    p = sub.add_parser("diagnose")
    p.add_argument("snapshot")
    p.add_argument("--model", nargs=1, default=["deep12-w8s8-1kv-shared"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.command == "fork" and not args.at < args.stop <= args.steps:
        parser.error(f"need --at < --stop <= --steps (got {args.at}, {args.stop}, {args.steps})")
    {"train": train_cmd, "fork": fork_cmd, "diagnose": diagnose_cmd}[args.command](args)


if __name__ == "__main__":
    main()
