"""Forward time and peak memory: compressed model vs its full-attention twin, side by side.

    python benchmarks/attention_scaling.py [--lengths 512 1024 2048 4096 8192] [--repeats 3]

Each (model, T) runs in a fresh subprocess so the peak resident-set growth during one
forward (``ru_maxrss`` after minus before) is that forward's own peak memory. Times are
the median of ``--repeats`` forwards after one warm-up. The table reports ratios
(compressed / full) -- absolute seconds depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

WORKER = r"""
import json, resource, sys, time, torch
from phaseinterp import CompressedConfig, CompressedTransformer
spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
cfg = CompressedConfig(**spec["cfg"])
model = CompressedTransformer(cfg)
tokens = torch.randint(0, cfg.d_vocab, (1, spec["T"]), generator=torch.Generator().manual_seed(0))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with torch.inference_mode():
    model(tokens)
peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
times = []
with torch.inference_mode():
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter(); model(tokens); times.append(time.perf_counter() - t0)
print(json.dumps({"peak_mib": peak_kib / 1024, "times": times}))
"""


def measure(cfg: dict, T: int, repeats: int, threads: int) -> dict:
    spec = json.dumps({"cfg": cfg, "T": T, "repeats": repeats, "threads": threads})
    out = subprocess.run([sys.executable, "-c", WORKER, spec], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["median_s"] = statistics.median(res["times"])
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--stride", type=int, default=4)
    args = parser.parse_args()
    base = dict(d_vocab=256, n_ctx=max(args.lengths), d_model=128, n_layers=2, n_heads=4, n_kv_heads=2,
                d_head=32, d_mlp=512, local_window=16)
    compressed = dict(base, compression="gated", window=args.stride, stride=args.stride)
    full = dict(base, compression=None)
    print(f"# attention_scaling: W=S={args.stride}, L=16, d_model=128, 2 layers, batch 1, "
          f"{args.threads} threads, median of {args.repeats}")
    print("| T | compressed s | full s | time ratio | compressed MiB | full MiB | memory ratio |")
    print("|---|---|---|---|---|---|---|")
    t_start = time.time()
    for T in args.lengths:
        c = measure(compressed, T, args.repeats, args.threads)
        f = measure(full, T, args.repeats, args.threads)
        print(f"| {T} | {c['median_s']:.3f} | {f['median_s']:.3f} | {c['median_s'] / f['median_s']:.2f} | "
              f"{c['peak_mib']:.0f} | {f['peak_mib']:.0f} | {c['peak_mib'] / max(f['peak_mib'], 1e-9):.2f} |",
              flush=True)
    print(f"# total wall time {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
