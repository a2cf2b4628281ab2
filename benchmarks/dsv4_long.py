"""DeepSeek-V4 at long prompts (issue 33): peak memory and time of the chunked forward and a knockout.

    python benchmarks/dsv4_long.py [--lengths 8192 32768 65536 131072] [--knockout 131072]

A small-width random `DeepseekV4ForCausalLM` with the published attention settings (sliding window
128, CSA rate 4, HCA rate 128, index top-k 512, hc_mult 4; layers CSA, HCA, CSA, HCA; hidden 64,
4 heads of 32 dims, float32) runs one forward per length through `HookedDeepseekV4` (query_chunk
"auto": chunked above 2,048 tokens). Per length: seconds, the measured peak (live tensor storage
counted op by op, `measure_forward_peak`), `estimate_forward_memory`'s peak and their ratio; then the
ratios 64K/32K and 128K/64K of peak and time beside the compute ratio. `--knockout T`: one prompt of
T tokens, the mean replacement of layer 0's KV head at the last position through the fast knockout
(clean state tails + the answer position), seconds and peak. `--profile T`: `phase_profile` on a
`NeedleRetrieval` batch of T-token prompts (one prompt per residue mod 4, best-effort placement: a
run of the path, not a measurement of the random model's accuracy), seconds and peak.
"""

from __future__ import annotations

import argparse
import time

import torch

CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"


def model_config(vocab: int = 512, index_n_heads: int = 4, index_head_dim: int = 16):
    """The benchmark model's config; the indexer's width is a parameter (published: 64 heads of 128)."""
    from transformers import DeepseekV4Config

    return DeepseekV4Config(
        vocab_size=vocab, hidden_size=64, moe_intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        head_dim=32, q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        layer_types=[CSA, HCA, CSA, HCA], compress_rates={CSA: 4, HCA: 128}, hc_mult=4, hc_sinkhorn_iters=3,
        mlp_layer_types=["hash_moe", "moe", "moe", "moe"], sliding_window=128, o_groups=2, o_lora_rank=32,
        index_n_heads=index_n_heads, index_head_dim=index_head_dim, index_topk=512, partial_rotary_factor=0.5,
        max_position_embeddings=1 << 20, attn_implementation="eager", bos_token_id=None, eos_token_id=None)


def build(seed: int = 0, **indexer):
    from transformers import DeepseekV4ForCausalLM

    from phaseinterp.models.hf import from_hf

    torch.manual_seed(seed)
    hf = DeepseekV4ForCausalLM(model_config(**indexer)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(("position_bias", "sinks")):
                p.normal_()
    return from_hf(hf)


def measure(model, fn):
    """(seconds, peak bytes beyond the weights) of ``fn()``, live tensor storage counted op by op."""
    from phaseinterp.models.hf.memory import measure_call_peak

    t0 = time.perf_counter()
    peak = measure_call_peak(fn)
    return time.perf_counter() - t0, peak


def main() -> None:
    from phaseinterp.models.hf.memory import estimate_forward_memory

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[8192, 32768, 65536, 131072])
    parser.add_argument("--knockout", type=int, nargs="*", default=[131072])
    parser.add_argument("--profile", type=int, nargs="*", default=[])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"model: {model!r}; weights {weights:,} bytes; float32; {args.threads} threads")
    print("| T | seconds | measured peak (bytes) | estimate (bytes) | estimate / measured |")
    print("|---|---|---|---|---|")
    rows = {}
    for T in args.lengths:
        tokens = torch.randint(0, model.cfg.d_vocab, (1, T), generator=torch.Generator().manual_seed(T))
        with torch.no_grad():
            seconds, peak = measure(model, lambda: model(tokens, return_type=None))
        est = estimate_forward_memory(model.hf.config, T, batch=1, act_bytes=4, weight_bytes=4, logits=False)
        rows[T] = (seconds, peak)
        print(f"| {T:,} | {seconds:.1f} | {peak + weights:,} | {est.peak:,} | {est.peak / (peak + weights):.3f} |",
              flush=True)
    cfg = model.hf.config

    def compute(T):  # attention key slots per query, summed: band + visible entries (HCA) / top-k (CSA)
        per = []
        for kind in cfg.layer_types:
            rate = cfg.compress_rates[kind]
            entries = min(cfg.index_topk, T // rate) if kind == CSA else T // rate / 2
            per.append(T * (min(T, cfg.sliding_window) + entries))
        return sum(per)

    for a, b in ((32768, 65536), (65536, 131072)):
        if a in rows and b in rows:
            print(f"{b // 1024}K / {a // 1024}K: peak {(rows[b][1] + weights) / (rows[a][1] + weights):.2f}x, "
                  f"time {rows[b][0] / rows[a][0]:.2f}x (attention compute ratio {compute(b) / compute(a):.2f}x)")
    for T in args.profile:
        import phaseinterp as pi
        from phaseinterp.tasks import NeedleRetrieval

        task = NeedleRetrieval(seq_len=T, key_tokens=4, value_tokens=4, residue_modulus=4, target_window=64)
        batch = task.generate(1, seed=0, strict=False)
        out = {}
        seconds, peak = measure(model, lambda: out.update(p=pi.phase_profile(
            model, batch, batch_size=1, n_bootstrap=10, n_permutations=19, progress=False)))
        p = out["p"]
        print(f"phase_profile on {len(batch.tokens)} prompts of {T:,} tokens: {seconds:.1f} s, peak "
              f"{peak + weights:,} bytes; {int(p.records.correct.sum())} of {len(p.records)} correct (random model)",
              flush=True)
    if args.knockout:
        import pandas as pd

        from phaseinterp.interventions.knockout import knockout_measures

        units = pd.DataFrame({"layer": [0], "heads": [list(range(model.cfg.n_heads))]})
        mean_z = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)
        for T in args.knockout:
            tokens = torch.randint(0, model.cfg.d_vocab, (1, T), generator=torch.Generator().manual_seed(1))
            answer = torch.tensor([3])
            out = {}
            seconds, peak = measure(model, lambda: out.update(r=knockout_measures(
                model, tokens, T - 1, answer, units, mean_z, batch_size=1, method="fast")))
            r = out["r"]
            print(f"knockout of layer 0's KV head at position {T - 1:,} ({T:,} tokens): {seconds:.1f} s, "
                  f"peak {peak + weights:,} bytes; answer log-prob clean {r.clean_logprob.item():.4f}, "
                  f"knocked out {r.knockout_logprob.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
