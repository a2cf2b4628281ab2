"""FP8 export of the tiny DeepSeek-V4s vs full precision (issue 23).

    python benchmarks/dsv4_fp8_precision.py [--n-per-residue 72] [--models dsv4-tiny]

Exports each shipped model with `phaseinterp zoo export NAME --layout deepseek --fp8` (rest in the
model's float32, and with --dtype bfloat16 as the release stores it), loads it with `load_hf`
(FP8 dequantized on a machine without FP8 kernels), and compares with the shipped model on the
evaluation prompts: max |logit difference| at the answer position, top-1 agreement overall and
by phase, and the two phase profiles (accuracy by phase with the shipped model's Wilson interval).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

import phaseinterp as pi
from phaseinterp.models.hf.export import export_release


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-per-residue", type=int, default=72)
    parser.add_argument("--models", nargs="*", default=["dsv4-tiny"])
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
        for rest in (None, torch.bfloat16):
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "ck"
                export_release(ref, out, fp8=True, dtype=rest)
                model = pi.load_hf(out, dtype=torch.float32)
                p = pi.phase_profile(model, batch, progress=False)
                with torch.no_grad():
                    logits = torch.cat([model(batch.tokens[i:i + 256])[rows[:len(batch.tokens[i:i + 256])],
                                                                       batch.answer_pos[i:i + 256]]
                                        for i in range(0, len(batch), 256)])
            agree = p.records.predicted.to_numpy() == base.records.predicted.to_numpy()
            by_phase = p.records.assign(agree=agree).groupby("phase").agree.mean()
            inside = (p.phase_accuracy >= base.phase_lower) & (p.phase_accuracy <= base.phase_upper)
            print(f"\n{name}, FP8 + {'float32' if rest is None else 'bfloat16'} rest, {len(batch)} prompts "
                  f"({args.n_per_residue} per residue), dequantized={model.metadata['checkpoint']['dequantized']}")
            print(f"max |logit diff| at the answer position: {(logits - ref_logits).abs().max().item():.3f} "
                  f"(logit range {ref_logits.min().item():.1f}..{ref_logits.max().item():.1f})")
            print(f"top-1 agreement: {agree.mean():.4f}; by phase: "
                  + ", ".join(f"{k}: {v:.4f}" for k, v in by_phase.items()))
            print("phase accuracy shipped [95% CI] -> FP8: " + "; ".join(
                f"{a:.3f} [{lo:.3f}, {hi:.3f}] -> {b:.3f}" for a, lo, hi, b in
                zip(base.phase_accuracy, base.phase_lower, base.phase_upper, p.phase_accuracy))
                  + f"; all inside: {bool(np.all(inside))}; period {base.period} -> {p.period}")


if __name__ == "__main__":
    main()
