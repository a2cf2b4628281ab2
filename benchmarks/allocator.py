"""Freed memory kept in the process (`phaseinterp.keep_freed_memory`) beside glibc's default,
on the same forwards, in fresh processes.

    python benchmarks/allocator.py [--models w4s4 deep12-w8s8-1kv-shared-equal deep12-full-equal dsv4-tiny]
                                   [--prompts 512] [--sizes 64 256] [--repeats 3]

Each repeat starts two child processes one after the other, the first with glibc's defaults,
the second calling `keep_freed_memory` first; each child times the answer logits (`last_logits`,
what `phase_profile` reads) of ``--prompts`` prompts per model in batches of each ``--sizes``
(one warm-up pass each, then one timed pass), with one torch thread, and reports its own minor
page faults and system CPU time (`resource.getrusage`). Printed: per model and size the median
time ratio default / kept (> 1: keeping is faster), and per setting the median faults and
system seconds of a whole child. The logits are compared between the two settings (max |diff|).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

DEFAULT_MODELS = ("w4s4", "deep12-w8s8-1kv-shared-equal", "deep12-full-equal", "dsv4-tiny")


def child(keep: bool, models: list[str], prompts: int, sizes: list[int]) -> None:
    import torch

    import phaseinterp as pi
    from phaseinterp.tasks import resolve_task
    from phaseinterp.zoo import deepseek_v4 as hf_zoo

    applied = pi.keep_freed_memory() if keep else False
    torch.set_num_threads(1)
    times, sums = {}, {}
    before = resource.getrusage(resource.RUSAGE_SELF)
    with torch.inference_mode():
        for name in models:
            model = (hf_zoo.load(name) if name in hf_zoo.available() else pi.zoo.load(name)).eval()
            batch = resolve_task(model, None).generate(72, seed=0)
            tokens = batch.tokens[:prompts, : int(batch.answer_pos[0]) + 1]
            for size in sizes:
                run = lambda: torch.cat([model.last_logits(tokens[i : i + size])  # noqa: E731
                                         for i in range(0, tokens.shape[0], size)])
                out = run()
                start = time.perf_counter()
                run()
                times[f"{name}@{size}"] = time.perf_counter() - start
                sums[f"{name}@{size}"] = out.double().sum().item()
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"applied": applied, "times": times, "sums": sums,
                      "minflt": after.ru_minflt - before.ru_minflt, "sys": after.ru_stime - before.ru_stime}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=["default", "kept"])
    args = parser.parse_args()
    if args.child:
        child(args.child == "kept", args.models, args.prompts, args.sizes)
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # glibc's defaults in the child
    env["PHASEINTERP_NO_PROGRESS"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    print(f"{args.prompts} prompts per model, 1 thread, load {os.getloadavg()[0]:.2f} at start")
    runs: dict[str, list[dict]] = {"default": [], "kept": []}
    for _ in range(args.repeats):
        for setting in ("default", "kept"):
            argv = [sys.executable, __file__, "--child", setting, "--prompts", str(args.prompts),
                    "--models", *args.models, "--sizes", *map(str, args.sizes)]
            out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
            runs[setting].append(json.loads(out.stdout.strip().splitlines()[-1]))
    if not all(r["applied"] for r in runs["kept"]):
        print("keep_freed_memory() returned False here (no glibc): both settings are the default")
    for key in runs["default"][0]["times"]:
        d = statistics.median(r["times"][key] for r in runs["default"])
        k = statistics.median(r["times"][key] for r in runs["kept"])
        diff = abs(runs["default"][0]["sums"][key] - runs["kept"][0]["sums"][key])
        print(f"{key:40s} default {d:6.2f} s  kept {k:6.2f} s  ratio {d / k:5.2f}   |sum diff| {diff:.1e}")
    for setting, rs in runs.items():
        print(f"{setting:8s} per child: minor faults {statistics.median(r['minflt'] for r in rs):>12,.0f}   "
              f"system CPU {statistics.median(r['sys'] for r in rs):6.1f} s")


if __name__ == "__main__":
    main()
