"""DeepSeek-V4's chunked forward against its compute bound: measured seconds / (FLOPs / GEMM rate).

    python benchmarks/dsv4_compute_bound.py [--lengths 8192 32768] [--repeats 2] [--threads 1]

The model is `benchmarks/dsv4_long.py`'s (a random small-width `DeepseekV4ForCausalLM` with the published
attention settings: window 128, CSA rate 4, HCA rate 128, top-k 512), run through `HookedDeepseekV4`
with its chunked forward (``query_chunk="auto"``), one prompt, no final logits.

FLOPs are the useful multiply-adds (2 per MAC), counted per layer kind:

    attention  (per query head, per query t)   4 * head_dim * (min(t + 1, window) + entries(t))
               entries(t) = min(top_k, (t + 1) // 4)             CSA: the indexer's selection
                          = (t + 1) // 128                       HCA: every closed entry
    indexer    (CSA, per query t)               2 * index_heads * index_head_dim * (t + 1) // 4
    the rest   every matmul outside the two above (projections, compressors, mHC, MoE experts, the
               indexer's own projections) as ``torch.utils.flop_counter.FlopCounterMode`` counts them on
               the same forward, minus the attention and indexer score matmuls it also saw

and the bound is FLOPs / the machine's float32 GEMM rate, measured in the same process (the median of
5 square matmuls of side 1,024 on the same threads). Elementwise work (softmax, RoPE, norms, gathers,
Sinkhorn) is not counted: a ratio above 1 is that work plus the small matmuls' inefficiency.

The indexer's selection is not a matmul either: ``torch.topk`` over each query's closed CSA entries
(about T^2 / 8 scores per CSA layer). The "topk s" column is that operator's own time in one more forward
under ``torch.profiler``; "topk / bound" above the bar (3) says the bar is out of reach of any forward
that selects with ``torch.topk``, whatever the rest costs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).parent))
from dsv4_long import CSA, build  # noqa: E402


def useful_attention_flops(cfg, T: int) -> tuple[int, int]:
    """(attention, indexer) useful FLOPs of one forward over T tokens, summed over layers."""
    t = torch.arange(1, T + 1, dtype=torch.float64)  # t + 1 tokens visible to query t
    band = t.clamp(max=cfg.sliding_window)
    attn = idx = 0.0
    for kind in cfg.layer_types:
        rate = cfg.compress_rates.get(kind) if cfg.compress_rates else None
        if rate is None:
            entries = torch.zeros_like(t)
        elif kind == CSA:
            entries = torch.div(t, rate, rounding_mode="floor").clamp(max=cfg.index_topk)
            idx += float((2 * cfg.index_n_heads * cfg.index_head_dim * torch.div(t, rate, rounding_mode="floor")).sum())
        else:
            entries = torch.div(t, rate, rounding_mode="floor")
        attn += float((4 * cfg.num_attention_heads * cfg.head_dim * (band + entries)).sum())
    return int(attn), int(idx)


def gemm_rate(n: int = 1024, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def counted_rest(model, tokens, cfg) -> tuple[int, int]:
    """(every matmul FLOP the counter saw, those of the attention's and the indexer's score/value matmuls)."""
    from phaseinterp.models.hf import attention as hf_attention
    from phaseinterp.models.hf import compressor as hf_compressor

    score_flops = [0]
    einsum = torch.einsum
    index_scores = hf_compressor.index_scores

    def counting_index(scorer, q, entries, x):  # the indexer's score matmul, [batch, C, head, d] x [batch, E, d]
        score_flops[0] += 2 * q.numel() * entries.shape[1]
        return index_scores(scorer, q, entries, x)

    def counting(spec, *ops):  # the chunked attention's band / entry einsums
        out = einsum(spec, *ops)
        # (the band's keys: a [batch, C, d, band] view now, gathered [batch, C, band, d] before 2026-12-06)
        if spec in ("bhcd,bcds->bhcs", "bhcd,bcsd->bhcs", "bhcd,bnd->bhcn", "bhcd,bckd->bhck"):
            score_flops[0] += 2 * ops[0].numel() // ops[0].shape[-1] * out.shape[-1] * ops[0].shape[-1]
        elif spec in ("bhcs,bcsd->bchd", "bhcn,bnd->bchd", "bhck,bckd->bchd"):
            score_flops[0] += 2 * ops[0].numel() * ops[1].shape[-1]
        elif spec == "bhcs,bcds->bchd":
            score_flops[0] += 2 * ops[0].numel() * ops[1].shape[-2]
        return out

    hf_attention.torch.einsum = counting
    hf_compressor.index_scores = counting_index
    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), counter:
            model(tokens, return_type=None)
    finally:
        hf_attention.torch.einsum = einsum
        hf_compressor.index_scores = index_scores
    # the indexer's score matmul runs over every entry closed by its chunk's end: its executed count
    # (`index_scores`, or transformers' scorer module where autograd runs it) leaves the rest, and the
    # useful count (useful_attention_flops) takes its place
    indexer = sum(int(ops.get(torch.ops.aten.bmm, 0)) for name, ops in counter.get_flop_counts().items()
                  if name.endswith("indexer.scorer"))
    return int(counter.get_total_flops()), score_flops[0] + indexer


def topk_seconds(model, tokens) -> float:
    """Self time of ``aten::topk`` in one forward under ``torch.profiler``: the indexer's selection (and the
    MoE router's top-k over a few experts, small beside it)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(tokens, return_type=None)
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key == "aten::topk") / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--index-heads", type=int, default=4,
                        help="the indexer's heads (4; DeepSeek-V4's published config: 64)")
    parser.add_argument("--index-head-dim", type=int, default=16,
                        help="the indexer's head width (16; DeepSeek-V4's published config: 128)")
    args = parser.parse_args()
    for name in ("repeats", "threads", "index_heads", "index_head_dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if min(args.lengths) <= 2048:
        parser.error(f"--lengths must be > 2048 (got {min(args.lengths)}): shorter prompts take the dense "
                     "forward, not the chunked one this measures")
    torch.set_num_threads(args.threads)
    model = build(index_n_heads=args.index_heads, index_head_dim=args.index_head_dim)
    cfg = model.hf.config
    if max(args.lengths) > cfg.max_position_embeddings:
        parser.error(f"--lengths {max(args.lengths)} exceeds max_position_embeddings={cfg.max_position_embeddings}")
    print(f"# dsv4_compute_bound: {model!r}; indexer {args.index_heads} heads x {args.index_head_dim}; float32; {args.threads} thread(s); median of {args.repeats}")
    print("| T | seconds | attention GFLOP | indexer GFLOP | rest GFLOP | GEMM GFLOP/s | bound s | measured / bound "
          "| topk s | topk / bound |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for T in args.lengths:
        tokens = torch.randint(0, model.cfg.d_vocab, (1, T), generator=torch.Generator().manual_seed(T))
        times = []
        with torch.no_grad():
            model(tokens[:, :256], return_type=None)
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                model(tokens, return_type=None)
                times.append(time.perf_counter() - t0)
        seconds = statistics.median(times)
        total, scores = counted_rest(model, tokens, cfg)
        attn, idx = useful_attention_flops(cfg, T)
        rest = total - scores
        rate = gemm_rate()
        bound = (attn + idx + rest) / rate
        topk = topk_seconds(model, tokens)
        print(f"| {T:,} | {seconds:.1f} | {attn / 1e9:.2f} | {idx / 1e9:.2f} | {rest / 1e9:.2f} | {rate / 1e9:.1f} | "
              f"{bound:.2f} | {seconds / bound:.1f} | {topk:.2f} | {topk / bound:.1f} |", flush=True)


if __name__ == "__main__":
    main()
