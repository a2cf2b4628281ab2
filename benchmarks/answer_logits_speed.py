"""The answer's logits: the last layer at the final position only (`last_logits`), and the band read
without gathering (`BlockBand`), each beside what it replaces.

    python benchmarks/answer_logits_speed.py [--models w4s4 w8s8-4kv deep12-w8s8-1kv-shared-equal dsv4-tiny ...]
                                             [--batch 64] [--repeats 7] [--threads 1]

Two side-by-side comparisons on the same prompt batch of each zoo model (its own task, seed 0),
alternated ``--repeats`` times (the machine is shared), median ratios:

1. ``model(tokens)[:, -1]`` (the full forward, then the last position) vs ``model.last_logits(tokens)``
   (every layer but the last over all positions; the last layer's keys/entries over all, its
   attention and MLP at the final position): what `phase_profile` and gate cycling read. Both
   families. The max |difference| of the logits is printed beside the ratio.
2. own family only: the full forward with the band of each query gathered (``[query, B, d_head]``
   copies, the layout before `BlockBand`) vs the full forward as shipped (`BlockBand`: one dense
   ``[block, block + B - 1]`` matmul per query block, the band its skewed diagonal).
3. own family only: the full forward with the MLP over all rows at once vs in blocks of
   `MLP_ROWS` (512) tokens, as shipped (bit-identical; the max |difference| is printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import torch  # noqa: E402

import phaseinterp as pi  # noqa: E402
import phaseinterp.models.attention as attention  # noqa: E402
import phaseinterp.models.transformer as transformer  # noqa: E402
from phaseinterp.tasks import resolve_task  # noqa: E402

DEFAULT_MODELS = ("w4s4", "w8s8-4kv", "full", "deep12-w8s8-1kv-shared-equal", "dsv4-tiny")


def gathered_band(k, v, p0, n, width, block=None):
    """The band as it was read before `BlockBand`: each query's B keys gathered."""
    band = p0 + torch.arange(n, device=k.device)[:, None] - width + 1 + torch.arange(width, device=k.device)
    return attention.GatheredBand(k[:, band.clamp(min=0)], v[:, band.clamp(min=0)])


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def load(name: str):
    from phaseinterp.zoo import deepseek_v4 as hf_zoo

    return hf_zoo.load(name) if name in hf_zoo.available() else pi.zoo.load(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--batch", type=int, default=64, help="prompts per forward")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}, {args.batch} prompts per forward, median of {args.repeats}")
    print("| model | tokens | full forward [:, -1] (s) | last_logits (s) | ratio | max abs diff "
          "| gathered band fwd (s) | BlockBand fwd (s) | ratio | MLP one-shot fwd (s) | MLP row blocks fwd (s) | ratio "
          "| MLP max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = transformer.MLP_ROWS
    shipped_block = attention.BlockBand
    for name in args.models:
        model = load(name)
        tokens = resolve_task(model).generate(4, seed=0, strict=False).tokens[: args.batch]
        own = hasattr(model.blocks[0].attn, "query_ranges")
        full_t, last_t, gather_t, block_t, one_t, rows_t = [], [], [], [], [], []
        mlp_diff = float("nan")
        with torch.inference_mode():
            diff = float((model(tokens)[:, -1] - model.last_logits(tokens)).abs().max())
            if own:
                transformer.MLP_ROWS = 1 << 62
                one_shot = model(tokens)
                transformer.MLP_ROWS = rows
                mlp_diff = float((one_shot - model(tokens)).abs().max())
            for _ in range(args.repeats):
                full_t.append(timed(lambda: model(tokens)[:, -1]))
                last_t.append(timed(model.last_logits, tokens))
                if own:
                    attention.BlockBand = gathered_band
                    try:
                        gather_t.append(timed(model, tokens))
                    finally:
                        attention.BlockBand = shipped_block
                    block_t.append(timed(model, tokens))
                    transformer.MLP_ROWS = 1 << 62
                    try:
                        one_t.append(timed(model, tokens))
                    finally:
                        transformer.MLP_ROWS = rows
                    rows_t.append(timed(model, tokens))
        med = statistics.median
        band = (f"{med(gather_t):.3f} | {med(block_t):.3f} | {med(gather_t) / med(block_t):.2f}x | "
                f"{med(one_t):.3f} | {med(rows_t):.3f} | {med(one_t) / med(rows_t):.2f}x | {mlp_diff:.1e}" if own
                else "— | — | — | — | — | — | —")
        print(f"| {name} | {tuple(tokens.shape)} | {med(full_t):.3f} | {med(last_t):.3f} | "
              f"{med(full_t) / med(last_t):.2f}x | {diff:.1e} | {band} |")


if __name__ == "__main__":
    main()
