"""Peak memory and time of one compressed forward at long T, with and without query chunks.

    nice -n 10 python benchmarks/long_context.py [--lengths 8192 16384 32768] [--chunk 1024]

Each (T, chunking) runs in a fresh subprocess with one torch thread, so the growth of the
peak resident set during the forward (``ru_maxrss`` after minus before) is that forward's
own peak memory. One forward per process (no warm-up: the unchunked 32K forward is the
expensive one); a tiny model (see MODEL) because the machine is shared. The last column
checks the claim: memory per token of the chunked path does not grow with T (a ratio
``peak(T) / peak(T_min) <= T / T_min`` is at most linear).

glibc keeps freed buffers in its heap (the dynamic mmap threshold grows after each large free), so
the resident set can overstate live memory; the workers set ``MALLOC_MMAP_THRESHOLD_=65536`` so
large buffers are mapped and returned when freed (``--glibc-default`` turns that off).

``--last`` also times an ablation-style last-position step at each T: one prefix pass
(chunked) over T-1 tokens, then the last token in 8 variants over a fork of the cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# One layer, one query head (the [T, key_slot] score matrix is then T * (L + T/S) floats).
MODEL = dict(d_vocab=256, n_ctx=32768, d_model=32, n_layers=1, n_heads=1, n_kv_heads=1, d_head=16, d_mlp=64,
             compression="deepseek", gate="vector", window=8, stride=4, local_window=16)

WORKER = r"""
import json, resource, sys, time, torch
from phaseinterp import CompressedConfig, CompressedTransformer
spec = json.loads(sys.argv[1])
torch.set_num_threads(1)
cfg = CompressedConfig(**{**spec["cfg"], "n_ctx": max(spec["cfg"]["n_ctx"], spec["T"])})
model = CompressedTransformer(cfg).set_query_chunk(spec["chunk"])
tokens = torch.randint(0, cfg.d_vocab, (1, spec["T"]), generator=torch.Generator().manual_seed(0))
out = {}
if spec["last"]:
    with torch.inference_mode():
        cache = model.init_cache()
        t0 = time.perf_counter(); model(tokens[:, :-1], cache=cache, return_type=None)
        out["prefix_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        model(tokens[:, -1:].repeat_interleave(8, 0), cache=cache.fork(8))
        out["last_s"] = time.perf_counter() - t0
else:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.inference_mode():
        t0 = time.perf_counter(); model(tokens); out["seconds"] = time.perf_counter() - t0
    out["peak_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps(out))
"""


ENV = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")


def measure(T: int, chunk, last: bool = False) -> dict:
    spec = json.dumps(dict(cfg=MODEL, T=T, chunk=chunk, last=last))
    done = subprocess.run([sys.executable, "-c", WORKER, spec], capture_output=True, text=True, env=ENV)
    if done.returncode != 0:
        raise RuntimeError(f"T={T} chunk={chunk} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--chunk", type=int, default=1024, help="queries per chunk (default 1024)")
    parser.add_argument("--last", action="store_true", help="also time prefix pass + last position")
    parser.add_argument("--glibc-default", action="store_true", help="leave glibc's mmap threshold alone")
    args = parser.parse_args()
    if args.glibc_default:
        ENV.pop("MALLOC_MMAP_THRESHOLD_", None)
    lengths = sorted(args.lengths)
    print(f"model: {json.dumps(MODEL)}; one forward per fresh process, 1 thread; "
          f"MALLOC_MMAP_THRESHOLD_={ENV.get('MALLOC_MMAP_THRESHOLD_', 'glibc default')}")
    print(f"| T | unchunked peak MiB | chunked ({args.chunk}) peak MiB | unchunked / chunked memory | "
          f"unchunked s | chunked s | chunked MiB per 1K tokens | chunked peak / peak(T={lengths[0]}) vs T ratio |")
    print("|---|---|---|---|---|---|---|---|")
    base = None
    for T in lengths:
        full, chunked = measure(T, None), measure(T, args.chunk)
        base = base or chunked["peak_mib"]
        print(f"| {T} | {full['peak_mib']:.0f} | {chunked['peak_mib']:.0f} | "
              f"{full['peak_mib'] / chunked['peak_mib']:.1f}x | {full['seconds']:.2f} | {chunked['seconds']:.2f} | "
              f"{1024 * chunked['peak_mib'] / T:.2f} | {chunked['peak_mib'] / base:.2f} vs {T / lengths[0]:.0f} |",
              flush=True)
    if args.last:
        print("\n| T | prefix pass (T-1 tokens, chunked) s | last position, 8 variants s |")
        print("|---|---|---|")
        for T in lengths:
            r = measure(T, args.chunk, last=True)
            print(f"| {T} | {r['prefix_s']:.2f} | {r['last_s']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
