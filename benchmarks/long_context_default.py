"""Long prompts on a shipped model with no chunking call: time and peak memory beside the compute.

    nice -n 10 python benchmarks/long_context_default.py [--model w4s4] [--lengths 8192 16384 32768 131072]
                                                         [--unchunked-up-to 16384] [--threads 1]

Each (T, setting) runs in a fresh subprocess: the shipped zoo model (2 layers) is rebuilt with
``n_ctx = T`` (its weights unchanged; RoPE tables extended) and runs ONE forward over T random
tokens (after a 256-token warm-up), batch 1, under ``torch.inference_mode``. "default" makes no ``set_query_chunk`` call (the
model picks query chunks itself above `attention.AUTO_CHUNK_ABOVE` new tokens); "unchunked" calls
``set_query_chunk(None)`` (the whole ``[T, key_slot]`` score matrix, quadratic memory; only up to
``--unchunked-up-to``). Peak memory: the growth of the resident set during the forward
(``ru_maxrss`` after minus before), with ``MALLOC_MMAP_THRESHOLD_=65536`` so freed buffers leave
the resident set. Times: wall and CPU seconds of the forward (on a shared machine the CPU time
is the fairer measure of the work; the ratios use it). The compute column is ``T * (L + T/S)`` (key slots summed over queries); the
ratio columns compare each length with the previous one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORKER = r"""
import dataclasses, json, resource, sys, time, torch
import phaseinterp as pi
from phaseinterp import CompressedTransformer
spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
shipped = pi.zoo.load(spec["model"])
model = CompressedTransformer(dataclasses.replace(shipped.cfg, n_ctx=spec["T"]))
model.load_state_dict(shipped.state_dict())
model.eval()
if spec["unchunked"]:
    model.set_query_chunk(None)
tokens = torch.randint(0, model.cfg.d_vocab, (1, spec["T"]), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():  # warm-up: first-call costs (allocator, kernels) out of the timing
    model(tokens[:, :256])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with torch.inference_mode():
    t0, c0 = time.perf_counter(), time.process_time()
    model(tokens)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
cfg = model.cfg
print(json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_mib": peak, "L": cfg.local_window, "S": cfg.stride,
                  "layers": cfg.n_layers}))
"""

ENV = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")


def measure(model: str, T: int, unchunked: bool, threads: int) -> dict:
    spec = json.dumps(dict(model=model, T=T, unchunked=unchunked, threads=threads))
    done = subprocess.run([sys.executable, "-c", WORKER, spec], capture_output=True, text=True, env=ENV)
    if done.returncode != 0:
        raise RuntimeError(f"T={T} unchunked={unchunked} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="w4s4", help="a shipped zoo model (default w4s4, 2 layers)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768, 131072])
    parser.add_argument("--unchunked-up-to", type=int, default=16384,
                        help="also run set_query_chunk(None) up to this T (quadratic memory; default 16384)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"model: {args.model} (shipped, n_ctx raised to T); one forward per fresh process, batch 1, "
          f"{args.threads} thread(s); MALLOC_MMAP_THRESHOLD_=65536; load: {os.getloadavg()[0]:.2f}")
    print("| T | default wall s | default CPU s | default peak MiB | unchunked CPU s | unchunked peak MiB | "
          "compute T*(L+T/S) ratio vs previous T | default CPU-time ratio vs previous T | default MiB per 1K tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    previous = None
    for T in sorted(args.lengths):
        d = measure(args.model, T, False, args.threads)
        u = measure(args.model, T, True, args.threads) if T <= args.unchunked_up_to else None
        compute = T * (d["L"] + T / d["S"])
        ratios = ("-", "-") if previous is None else (f"{compute / previous[0]:.2f}x",
                                                      f"{d['cpu_s'] / previous[1]:.2f}x")
        u_s, u_mib = ("not run", "not run") if u is None else (f"{u['cpu_s']:.2f}", f"{u['peak_mib']:.0f}")
        print(f"| {T} | {d['seconds']:.2f} | {d['cpu_s']:.2f} | {d['peak_mib']:.0f} | {u_s} | {u_mib} | {ratios[0]} | "
              f"{ratios[1]} | "
              f"{1024 * d['peak_mib'] / T:.1f} |", flush=True)
        previous = (compute, d["cpu_s"])
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
