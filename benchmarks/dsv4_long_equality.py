"""The chunked DeepSeek-V4 forward against transformers' eager forward, per phase (issue 33).

    python benchmarks/dsv4_long_equality.py

For each model (a random model with the published attention settings at 2,300 tokens, where the
indexer's top-512 selects from position 2,051 on; the shipped dsv4-tiny and dsv4.1-tiny at their
n_ctx of 256), the max |logit diff| between `HookedDeepseekV4` with forced query chunks and
transformers' `DeepseekV4ForCausalLM` (eager, no cache), per query position's phase mod the CSA rate
and mod the HCA rate (float32). Prints one row per model: the largest difference over every phase
of each rate, and how many phases were covered.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    import phaseinterp as pi
    from phaseinterp.models.hf import from_hf
    from test_dsv4_long import published_attention, randomized, tokens_of

    torch.set_num_threads(2)
    cases = [("random, published attention (window 128, rates 4/128, top-k 512)",
              randomized(published_attention()), 2300, 256)]
    for name in ("dsv4-tiny", "dsv4.1-tiny"):
        model = pi.zoo.load(name)
        cases.append((name, model.hf, model.cfg.n_ctx, 16))
    print("| model | T | query chunk | CSA rate: phases covered, max |diff| | HCA rate: phases covered, max |diff| |")
    print("|---|---|---|---|---|")
    for label, hf, T, chunk in cases:
        model = from_hf(hf)
        tokens = tokens_of(hf.config.vocab_size, T, batch=2)
        with torch.no_grad():
            ref = hf(tokens, use_cache=False).logits
            model.set_query_chunk(chunk)
            out = model(tokens)
        diff = (out - ref).abs().amax(dim=(0, 2))  # per position
        cells = []
        for kind in ("compressed_sparse_attention", "heavily_compressed_attention"):
            rate = hf.config.compress_rates[kind]
            per_phase = [diff[p::rate].max().item() for p in range(min(rate, T))]
            cells.append(f"{len(per_phase)} of {rate}, {max(per_phase):.1e}")
        print(f"| {label} | {T:,} | {chunk} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
