"""FP8 export of the tiny DeepSeek-V4s vs full precision (issue 23).

    python benchmarks/dsv4_fp8_precision.py [--n-per-residue 72] [--models dsv4-tiny]
        [--fp8-scales pow2 exact] [--rest float32 bfloat16]

``--models``: any shipped HF DeepSeek-V4 zoo names: dsv4-tiny and dsv4.1-tiny (trained in float32,
rounded to FP8 by the export) or dsv4-tiny-fp8 (trained FP8-native, as a release is: its weights
are already on the FP8 grid of the power-of-two scales).

Exports each shipped model with `phaseinterp zoo export NAME --layout deepseek --fp8 --experts fp8
[--fp8-scales pow2|exact] --out DIR` (rest in the model's float32, and with --dtype bfloat16 as the release
stores it), loads it with `load_hf`
(FP8 dequantized on a machine without FP8 kernels), and compares with the shipped model on the
evaluation prompts: max |logit difference| at the answer position, top-1 agreement overall and
by phase, and the two phase profiles (accuracy by phase with the shipped model's Wilson interval).
Where top-1 flips, it prints how close the full-precision model's top two logits were there
(its margin) next to the margin of all prompts.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

import phaseinterp as pi
from phaseinterp.models.hf.export import DEFAULT_FP8_SCALES, FP8_SCALES, export_release


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-per-residue", type=int, default=72)
    parser.add_argument("--models", nargs="*", default=["dsv4-tiny"])
    parser.add_argument("--fp8-scales", nargs="+", choices=sorted(FP8_SCALES), default=[DEFAULT_FP8_SCALES])
    parser.add_argument("--rest", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.models:
        ref = pi.zoo.load(name)
        task = pi.zoo.task_for(ref)
        batch = task.generate(args.n_per_residue, seed=0)
        base = pi.phase_profile(ref, batch, progress=False)
        with torch.no_grad():
            rows = torch.arange(len(batch))
            ref_logits = torch.cat([ref(batch.tokens[i:i + 256])[rows[:len(batch.tokens[i:i + 256])],
                                                                  batch.answer_pos[i:i + 256]]
                                    for i in range(0, len(batch), 256)])
        top2 = ref_logits.topk(2, dim=-1).values
        margin = (top2[:, 0] - top2[:, 1]).numpy()
        for scales, rest_name in [(sc, r) for sc in args.fp8_scales for r in args.rest]:
            rest = None if rest_name == "float32" else torch.bfloat16
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "ck"
                export_release(ref, out, fp8=True, fp8_scales=scales, dtype=rest, experts="fp8")  # FP8 everywhere
                model = pi.load_hf(out, dtype=torch.float32)
                p = pi.phase_profile(model, batch, progress=False)
                with torch.no_grad():
                    logits = torch.cat([model(batch.tokens[i:i + 256])[rows[:len(batch.tokens[i:i + 256])],
                                                                       batch.answer_pos[i:i + 256]]
                                        for i in range(0, len(batch), 256)])
            agree = p.records.predicted.to_numpy() == base.records.predicted.to_numpy()
            by_phase = p.records.assign(agree=agree).groupby("phase").agree.mean()
            inside = (p.phase_accuracy >= base.phase_lower) & (p.phase_accuracy <= base.phase_upper)
            print(f"\n{name}, FP8 ({scales} scales) + {rest_name} rest, {len(batch)} prompts "
                  f"({args.n_per_residue} per residue), dequantized={model.metadata['checkpoint']['dequantized']}")
            print(f"max |logit diff| at the answer position: {(logits - ref_logits).abs().max().item():.3f} "
                  f"(logit range {ref_logits.min().item():.1f}..{ref_logits.max().item():.1f})")
            print(f"top-1 agreement: {agree.mean():.4f}; by phase: "
                  + ", ".join(f"{k}: {v:.4f}" for k, v in by_phase.items()))
            print("phase accuracy shipped [95% CI] -> FP8: " + "; ".join(
                f"{a:.3f} [{lo:.3f}, {hi:.3f}] -> {b:.3f}" for a, lo, hi, b in
                zip(base.phase_accuracy, base.phase_lower, base.phase_upper, p.phase_accuracy))
                  + f"; all inside: {bool(np.all(inside))}; period {base.period} -> {p.period}")
            flip = (logits.argmax(-1) != ref_logits.argmax(-1)).numpy()
            if flip.any():
                second = (logits.argmax(-1) == ref_logits.topk(2, dim=-1).indices[:, 1]).numpy()
                worst = margin[flip].max()
                print(f"flips (argmax of these logits): {int(flip.sum())}; full-precision top-1 - top-2 margin at "
                      f"the flips: median {np.median(margin[flip]):.3f}, max {worst:.3f}; all prompts: median "
                      f"{np.median(margin):.3f}, {np.mean(margin <= worst):.4f} have margin <= {worst:.3f}; "
                      f"flips to the full-precision second choice: {second[flip].mean():.3f}")


if __name__ == "__main__":
    main()
