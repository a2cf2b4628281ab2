"""The controlled claim on natural text, on these CPUs: 2-layer models at `cpu-small` widths pretrained
on Python source, W = S = 4, its full-attention twin and a W = S = 8 arm (RESULTS, "Natural text:
Python source", states the pre-registered outcomes).

    python benchmarks/python_source_corpus.py --out ~/phaseinterp-runs/corpus/python-source.jsonl
    phaseinterp tokenizer train --data ~/phaseinterp-runs/corpus/python-source.jsonl --vocab-size 4096 \\
        --out ~/phaseinterp-runs/tokenizer-py-4k
    python benchmarks/pretrain_python_code.py train --root ~/phaseinterp-runs/python-code   # resumable
    python benchmarks/pretrain_python_code.py status --root ~/phaseinterp-runs/python-code
    python benchmarks/pretrain_python_code.py probe --root ~/phaseinterp-runs/python-code --out probes.csv  # newest

``train`` runs the arms round-robin, ``--chunk-steps`` optimizer steps at a time on one CPU thread,
in the order of ``--arms`` in pairs (the compressed model and its twin advance together, so their
curves are compared at matched token counts), and resumes every arm from its newest checkpoint: stop
it at any time and rerun the same command. Each arm is a `phaseinterp.train.pretrain` run folder
(``ROOT/ARM``) with a snapshot kept every ``--keep-every`` steps; keep ``ROOT`` outside a git work
tree. 256-token sequences, 8 per step, 24,000 steps (49.2M tokens, twice the predicted induction-head
formation point for this batch and context), no needle rows (pure text), the held-out needle probe
every 500 steps.

``probe`` scores kept snapshots (the newest by default; ``--step N[,M...]`` or ``--all-steps``) without
fine-tuning on five probes built from the held-out split: ``copy`` (`SpanCopy`: a random 8-token span
copied, by its source token's phase), ``identifier`` (`IdentifierRecall`: an identifier's next token at
its use, by the phase of its definition) and ``identifier-nodef`` (the same prompts, the definition
replaced: what the code gives away without it), ``needle-prefix`` and ``needle-in_sequence``
(`TextNeedle` in both paddings). It appends one row per residue to ``--out`` (arm, step, tokens, probe,
residue, phase, n, accuracy, ci_low, ci_high) and one per probe to ``OUT-summary.csv``, skips what is
there already, and prints mean, worst and best phase, gap and the period test per (arm, step, probe).
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


def share_tokens(root: Path, arm: str) -> None:
    """Hard-link a sibling arm's tokenized corpus into ``ROOT/ARM/data`` before the arm's first chunk:
    every arm reads the same corpus with the same tokenizer, and `tokenize_corpus` reuses a cache keyed
    on that content (re-tokenizing 160 MiB costs each arm about 10 minutes)."""
    target = root / arm / "data"
    if (target / "manifest.json").is_file():
        return
    for sibling in sorted(root.glob("*/data/manifest.json")):
        source = sibling.parent
        target.mkdir(parents=True, exist_ok=True)
        for name in ("train.bin", "heldout.bin", "manifest.json"):  # the manifest last: it names a complete cache
            if not (target / name).exists():
                os.link(source / name, target / name)
        return


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
                share_tokens(root, arm)
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


PROBES = ("copy", "identifier", "identifier-nodef", "needle-prefix", "needle-in_sequence")


def probe_tasks(folder: Path, tokenizer, probes: list[str], sizes: dict) -> dict:
    """The probes' prompts (``TaskBatch`` per probe) on the arm's held-out split, built once per split."""
    import dataclasses
    import json

    from phaseinterp.tasks import IdentifierRecall, SpanCopy, TextNeedle
    from phaseinterp.train.corpus import TokenizedCorpus

    corpus = TokenizedCorpus(folder / "data", json.loads((folder / "data" / "manifest.json").read_text()))
    heldout = corpus.tokens("heldout")
    batches = {}
    if "copy" in probes:
        batches["copy"] = SpanCopy.from_tokenizer(tokenizer, heldout).generate(sizes["copy"], seed=0)
    if "identifier" in probes or "identifier-nodef" in probes:
        task = IdentifierRecall.from_tokenizer(tokenizer, heldout)
        n = sizes["identifier"] or task.capacity()
        cases = task.availability()["cases"]
        print(f"identifier cases per residue {cases.min()}..{cases.max()} ({len(task.cases())} in all, calibration "
              f"pairs included); {n} per residue taken with matched moments", flush=True)
        for name, control in (("identifier", False), ("identifier-nodef", True)):
            if name in probes and n == 0:
                print(f"{name}: the held-out code gives no moment-matched identifier cases; skipped")
            elif name in probes:
                batches[name] = dataclasses.replace(task, control=control).generate(n, seed=0)
    for padding in ("prefix", "in_sequence"):
        if f"needle-{padding}" in probes:
            # the training probe's geometry (`probe_settings` at 256 tokens), in both paddings
            settings = dict(seq_len=256, residue_modulus=24, n_records=8, target_window=85, padding=padding)
            task = TextNeedle.from_tokenizer(tokenizer, heldout, **settings)
            batches[f"needle-{padding}"] = task.generate(sizes["needle"], seed=0)
    return batches


def probe(args) -> int:
    import pandas as pd

    from phaseinterp import phase_profile
    from phaseinterp.train.pretrain import load_snapshot, snapshot_steps
    from phaseinterp.train.tokenizer import TextTokenizer

    torch.set_num_threads(args.threads)
    root = Path(os.path.expanduser(args.root))
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    probes = [p.strip() for p in args.probes.split(",") if p.strip()]
    unknown = [a for a in arms if a not in ARMS] + [p for p in probes if p not in PROBES]
    if unknown:
        print(f"unknown arms or probes {unknown}; arms: {sorted(ARMS)}, probes: {list(PROBES)}", file=sys.stderr)
        return 2
    if args.all_steps and args.step is not None:
        print("--step and --all-steps: pick one", file=sys.stderr)
        return 2
    out = Path(os.path.expanduser(args.out))
    summary_path = out.with_name(out.stem + "-summary.csv")
    if out.resolve().is_relative_to(root.resolve()):
        print(f"--out {out} lies under --root {root}: the runs are read only", file=sys.stderr)
        return 2
    done = pd.read_csv(summary_path) if summary_path.is_file() else pd.DataFrame(columns=["arm", "step", "probe"])
    seen = set(zip(done["arm"], done["step"].astype(int), done["probe"]))
    tokenizer = TextTokenizer(os.path.expanduser(args.tokenizer))
    sizes = {"copy": args.copy_per_residue, "identifier": args.identifier_per_residue, "needle": args.needle_per_residue}
    batches_by_split: dict = {}
    for arm in arms:
        folder = root / arm
        kept = snapshot_steps(folder) if (folder / "checkpoints").is_dir() else []
        if not kept:
            print(f"{arm}: no kept snapshot yet")
            continue
        steps = kept if args.all_steps else args.step or [None]
        missing = [step for step in steps if step is not None and step not in kept]
        if missing:
            print(f"{arm}: steps {missing} are not kept snapshots (kept: {kept})", file=sys.stderr)
            return 2
        split_key = (folder / "data" / "manifest.json").read_text()
        if split_key not in batches_by_split:
            t0 = time.time()
            batches_by_split[split_key] = probe_tasks(folder, tokenizer, probes, sizes)
            print(f"prompts built in {time.time() - t0:.0f} s: " + ", ".join(
                f"{name} {len(b)} ({len(b) // b.residue_modulus} per residue)"
                for name, b in batches_by_split[split_key].items()), flush=True)
        batches = batches_by_split[split_key]
        for step in steps:
            t_snapshot = time.time()
            model = load_snapshot(folder, step)
            step, tokens = int(model.metadata["step"]), int(model.metadata["tokens"])
            rows, summaries = [], []
            for name in probes:
                if (arm, step, name) in seen or name not in batches:
                    continue
                t0 = time.time()
                profile = phase_profile(model, batches[name], batch_size=args.batch_size, progress=False,
                                        label=f"{arm} step {step} {name}")
                seconds = time.time() - t0
                frame = profile.residue_frame()
                rows.append(pd.DataFrame({"arm": arm, "step": step, "tokens": tokens, "probe": name,
                                          "residue": frame["residue"], "phase": frame["phase"], "n": frame["n"],
                                          "accuracy": frame["accuracy"], "ci_low": frame["lower"],
                                          "ci_high": frame["upper"]}))
                d = profile.to_dict()
                summaries.append({"arm": arm, "step": step, "tokens": tokens, "probe": name, "stride": profile.stride,
                                  "n_prompts": d["n_prompts"], "mean": d["mean"],
                                  "worst_phase": d["worst_phases"][0], "worst_phase_accuracy": d["worst_phase_accuracy"],
                                  "best_phase": d["best_phase"], "best_phase_accuracy": d["best_phase_accuracy"],
                                  "phase_gap": d["phase_gap"], "period": d["period"], "best_period": d["best_period"],
                                  "period_p_value": d["period_p_value"],
                                  "homogeneity_p_value": d["homogeneity_p_value"],
                                  "interval": d["interval_method"], "seconds": seconds})
                print(f"{arm} step {step} ({tokens / 1e6:.1f}M tokens) {name:<18} mean {d['mean']:.3f}  worst phase "
                      f"{d['worst_phases'][0]} {d['worst_phase_accuracy']:.3f}  best phase {d['best_phase']} "
                      f"{d['best_phase_accuracy']:.3f}  gap {100 * d['phase_gap']:.1f} pp  period {d['period']} "
                      f"(best {d['best_period']}, p = {d['period_p_value']:.3g})  [{d['n_prompts']} prompts, "
                      f"{seconds:.0f} s]", flush=True)
            if rows:
                _append_csv(out, pd.concat(rows, ignore_index=True))
                _append_csv(summary_path, pd.DataFrame(summaries))
                seen.update((arm, step, s["probe"]) for s in summaries)
            print(f"{arm} step {step}: {time.time() - t_snapshot:.0f} s", flush=True)
    return 0


def curves(args) -> int:
    """The probes' curves against tokens, one markdown row per (arm, step) of ``--summary`` (the
    ``OUT-summary.csv`` that ``probe`` writes): each probe's mean, phase gap and period test."""
    import pandas as pd

    summary = pd.read_csv(Path(os.path.expanduser(args.summary)))
    probes = [p for p in args.probes.split(",") if p]
    missing = sorted(set(probes) - set(summary.probe))
    if missing:
        print(f"--probes: {missing} not in {args.summary} (it holds {sorted(set(summary.probe))})", file=sys.stderr)
        return 2

    def cell(row) -> str:
        period = f"**period {int(row.period)}**" if row.period == row.period else "no period"
        return f"{row['mean']:.1%}, gap {100 * row.phase_gap:.1f} pp, {period} (p = {row.period_p_value:.2g})"

    print("| model | step | tokens | " + " | ".join(probes) + " |")
    print("|---|---|---|" + "---|" * len(probes))
    for (arm, step), rows in summary.groupby(["arm", "step"], sort=False):
        by_probe = {row.probe: row for _, row in rows.iterrows()}
        cells = [cell(by_probe[p]) if p in by_probe else "" for p in probes]
        print(f"| {arm} | {step:,} | {rows.tokens.iloc[0] / 1e6:.1f}M | " + " | ".join(cells) + " |")
    return 0


def _steps(text: str) -> list[int]:
    try:
        steps = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of steps") from None
    if not steps or min(steps) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: steps are positive integers")
    return steps


def _append_csv(path: Path, frame) -> None:
    """``frame`` appended to the CSV at ``path`` (written whole, atomically: an interrupted run loses
    at most the snapshot it was scoring)."""
    import pandas as pd

    from phaseinterp._files import atomic_write

    if path.is_file():
        frame = pd.concat([pd.read_csv(path), frame], ignore_index=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, frame.to_csv(index=False).encode())


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
    p = sub.add_parser("probe", help="score kept snapshots on the copying, identifier and needle probes")
    p.add_argument("--root", required=True, help="the runs' folder (read only)")
    p.add_argument("--out", required=True, help="the per-residue CSV (appended; OUT-summary.csv beside it)")
    p.add_argument("--arms", default=DEFAULT_ORDER, help=f"comma-separated (default {DEFAULT_ORDER})")
    p.add_argument("--step", type=_steps, default=None, help="these kept snapshots, e.g. 4000 or 2000,4000 "
                   "(default: the newest)")
    p.add_argument("--all-steps", action="store_true", help="every kept snapshot")
    p.add_argument("--probes", default=",".join(PROBES), help=f"comma-separated (default {','.join(PROBES)})")
    p.add_argument("--copy-per-residue", type=int, default=400, help="span-copy prompts per residue mod 24 (400: "
                   "2,400 per phase at S = 4, +-2 pp)")
    p.add_argument("--identifier-per-residue", type=int, default=0,
                   help="identifier prompts per residue (0: as many as the held-out code gives with matched moments)")
    p.add_argument("--needle-per-residue", type=int, default=100, help="TextNeedle prompts per residue, each padding")
    p.add_argument("--tokenizer", default="~/phaseinterp-runs/tokenizer-py-4k")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    c = sub.add_parser("curves", help="the probes against tokens, a markdown table from probe's OUT-summary.csv")
    c.add_argument("--summary", required=True, help="probe's OUT-summary.csv")
    c.add_argument("--probes", default="copy,identifier", help="comma-separated columns (default copy,identifier)")
    i = sub.add_parser("install", help="install a natural-text zoo model (phaseinterp.zoo.TEXT_ENTRIES) from its arm's run")
    i.add_argument("--root", required=True, help="the runs' folder (read only)")
    i.add_argument("--name", required=True, help="the zoo name (py-w4s4, py-full, py-w8s8)")
    i.add_argument("--tokenizer", default="~/phaseinterp-runs/tokenizer-py-4k")
    args = parser.parse_args(argv)
    if args.verb == "install":
        from phaseinterp import zoo

        entry = zoo.TEXT_ENTRIES.get(args.name)
        if entry is None:
            print(f"--name: unknown natural-text zoo model {args.name!r}; valid: {sorted(zoo.TEXT_ENTRIES)}", file=sys.stderr)
            return 2
        root = Path(os.path.expanduser(args.root))
        print(zoo.install_text(args.name, root / entry.arm, os.path.expanduser(args.tokenizer)))
        return 0
    if args.verb == "curves":
        return curves(args)
    if args.verb == "train":
        torch.set_num_threads(args.threads)
        return train(args)
    if args.verb == "probe":
        return probe(args)
    return status(args)


if __name__ == "__main__":
    sys.exit(main())
