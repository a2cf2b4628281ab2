"""Does what a hook sees depend on the batch size? The report's case, measured.

    python benchmarks/hook_batch_independence.py [--model dsv4-tiny] [--sizes 64 400 512]

The same 64 prompts of 128 tokens, at the front of batches of each size, with a TransformerLens-style
edit of ``blocks.0.attn.hook_pattern`` that zeroes query row 10 by index; prints, per batch size, the
largest |logit| difference of those 64 prompts from the batch-64 run (0 without the hook), or the
error the forward raised. Run it at two commits (PYTHONPATH=<worktree>) to compare.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dsv4-tiny")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 400, 512])
    parser.add_argument("--length", type=int, default=128)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import phaseinterp as pi

    model = pi.load(args.model)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.d_vocab, (max(args.sizes), args.length), generator=gen)

    def zero_row(pattern, hook):
        pattern[:, :, 10] = 0
        return pattern

    hooks = [("blocks.0.attn.hook_pattern", zero_row)]
    reference = None
    for size in args.sizes:
        with torch.no_grad():
            try:
                logits = model.run_with_hooks(tokens[:size], fwd_hooks=hooks)[:64]
            except Exception as err:  # the old chunking raised IndexError where a chunk held < 11 queries
                print(f"batch {size}: {type(err).__name__}: {err}")
                continue
            clean = model(tokens[:size])[:64]
        if reference is None:
            reference, clean_reference = logits, clean
        print(f"batch {size}: hooked max |diff| vs batch {args.sizes[0]} = {float((logits - reference).abs().max()):.3g}; "
              f"unhooked {float((clean - clean_reference).abs().max()):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
