"""Forward time and peak memory: compressed model vs its full-attention twin, side by side.

    python benchmarks/attention_scaling.py [--lengths 2048 8192] [--rounds 3] [--repeats 2] [--threads 1]

Each (model, T) forward runs in a fresh subprocess so the peak resident-set growth during one
forward (``ru_maxrss`` after minus before) is that forward's own peak memory. For each T the two
models run ``--rounds`` times in alternation (compressed first in even rounds, full first in odd
ones), each run timing the median of ``--repeats`` forwards after one warm-up; the table gives the
median per model and the median of the per-round ratios (compressed / full), which keeps the two
under the same load on a shared machine.

The bound column is the ratio of *useful* FLOPs, what a perfect kernel would have to compute: every
matmul outside attention as ``torch.utils.flop_counter`` counts it (projections, compressor, MLP,
unembedding), plus ``4 * d_head`` per (query head, query, allowed key) for attention (QK^T and PV),
the allowed keys counted from the masks the forward itself builds (a compressed query's band and its
visible entries; every earlier token for the full twin). A measured ratio at the bound means the
compressed model wastes nothing beyond what its twin wastes.
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
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode
from phaseinterp import CompressedConfig, CompressedTransformer
from phaseinterp.models import attention
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
useful = None
if spec["flops"]:
    allowed = [0]
    sdpa = F.scaled_dot_product_attention
    def counting(q, k, v, attn_mask=None, is_causal=False, scale=None):
        heads, n_q, n_k = q.shape[1], q.shape[2], k.shape[2]
        if is_causal:
            allowed[0] += q.shape[0] * heads * n_q * (n_q + 1) // 2
        elif attn_mask is not None:
            ok = attn_mask == 0 if attn_mask.dtype != torch.bool else attn_mask
            allowed[0] += int(ok.expand(q.shape[0], heads, n_q, n_k).sum())
        else:
            allowed[0] += q.shape[0] * heads * n_q * n_k
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    attention.F.scaled_dot_product_attention = counting
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        model(tokens)
    attention.F.scaled_dot_product_attention = sdpa
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    outside = sum(n for op, n in by_op.items() if "scaled_dot_product" not in op)
    useful = outside + 4 * cfg.d_head * allowed[0]
print(json.dumps({"peak_mib": peak_kib / 1024, "times": times, "useful_flops": useful}))
"""


def measure(cfg: dict, T: int, repeats: int, threads: int, flops: bool) -> dict:
    spec = json.dumps({"cfg": cfg, "T": T, "repeats": repeats, "threads": threads, "flops": flops})
    out = subprocess.run([sys.executable, "-c", WORKER, spec], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["median_s"] = statistics.median(res["times"])
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stride", type=int, default=4)
    args = parser.parse_args()
    for name in ("rounds", "repeats", "threads", "stride"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be >= 1")
    if min(args.lengths) < 1:
        parser.error(f"--lengths must be >= 1 (got {min(args.lengths)})")
    base = dict(d_vocab=256, n_ctx=max(args.lengths), d_model=128, n_layers=2, n_heads=4, n_kv_heads=2,
                d_head=32, d_mlp=512, local_window=16)
    models = {"compressed": dict(base, compression="gated", window=args.stride, stride=args.stride),
              "full": dict(base, compression=None)}
    print(f"# attention_scaling: W=S={args.stride}, L=16, d_model=128, 2 layers, batch 1, {args.threads} "
          f"thread(s); {args.rounds} alternating rounds x median of {args.repeats} forwards")
    print("| T | compressed s | full s | time ratio (median of rounds) | per-round ratios | useful-FLOP bound | "
          "measured / bound | compressed MiB | full MiB | memory ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    t_start = time.time()
    for T in args.lengths:
        runs: dict[str, list[dict]] = {"compressed": [], "full": []}
        for r in range(args.rounds):
            order = ("compressed", "full") if r % 2 == 0 else ("full", "compressed")
            for name in order:
                runs[name].append(measure(models[name], T, args.repeats, args.threads, flops=r == 0))
        ratios = [c["median_s"] / f["median_s"] for c, f in zip(runs["compressed"], runs["full"])]
        c_s = statistics.median(x["median_s"] for x in runs["compressed"])
        f_s = statistics.median(x["median_s"] for x in runs["full"])
        c_mib = statistics.median(x["peak_mib"] for x in runs["compressed"])
        f_mib = statistics.median(x["peak_mib"] for x in runs["full"])
        bound = runs["compressed"][0]["useful_flops"] / runs["full"][0]["useful_flops"]
        ratio = statistics.median(ratios)
        print(f"| {T} | {c_s:.3f} | {f_s:.3f} | {ratio:.2f} | {', '.join(f'{x:.2f}' for x in ratios)} | "
              f"{bound:.2f} | {ratio / bound:.2f} | {c_mib:.0f} | {f_mib:.0f} | {c_mib / max(f_mib, 1e-9):.2f} |",
              flush=True)
    print(f"# total wall time {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
