"""Memory plan for DeepSeek-V4 (issue 23): estimate vs measured peak on the tiny models, then the real configs.

    python benchmarks/dsv4_memory.py [--lengths 64 128 256] [--batch 8]

Part 1: for each shipped tiny model and length T, `estimate_forward_memory` (from the config
alone) beside `measure_forward_peak` (CPU: live tensor storage during the forward, plus weights;
CUDA: torch.cuda.max_memory_allocated), and their ratio. Part 2: for the published configs in
phaseinterp/models/hf/configs/deepseek_v4_published.json that are complete, weights (FP8 experts,
BF16 rest), the wrapper's full-forward activation peak and the generation KV cache at 8K, 64K and
1M tokens, with the number of 80 GB / 141 GB devices one forward needs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import phaseinterp as pi
from phaseinterp.models.hf.memory import estimate_forward_memory, measure_forward_peak, memory_plan

PUBLISHED = Path(pi.__file__).parent / "models" / "hf" / "configs" / "deepseek_v4_published.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[64, 128, 256])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--models", nargs="*", default=["dsv4-tiny", "dsv4.1-tiny"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | T | batch | estimate (bytes) | measured peak (bytes) | estimate / measured |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        model = pi.zoo.load(name)
        dtype_bytes = next(model.parameters()).element_size()
        for T in args.lengths:
            tokens = torch.randint(0, model.cfg.d_vocab, (args.batch, T), generator=torch.Generator().manual_seed(0))
            measured = measure_forward_peak(model, tokens)
            est = estimate_forward_memory(model.hf.config, T, batch=args.batch, act_bytes=dtype_bytes,
                                          weight_bytes=dtype_bytes)
            print(f"| {name} | {T} | {args.batch} | {est.peak:,} | {measured:,} | {est.peak / measured:.3f} |")
    published = json.loads(PUBLISHED.read_text())
    for label, entry in published.items():
        if label.startswith("_"):
            continue
        if not entry["complete"]:
            print(f"\n{label}: not estimated ({entry['missing']}); source: {entry['source']}")
            continue
        print(f"\n{label} (source: {entry['source'].split(':')[0]}); weights MXFP4 experts + BF16 rest, "
              "activations BF16, batch 1, the chunked forward (`memory_plan`):")
        print("| tokens | experiment | weights (GB) | one layer's activations (GB) | knockout state (GB) | "
              "80 GB devices | 141 GB devices |")
        print("|---|---|---|---|---|---|---|")
        from phaseinterp.models.hf.memory import config_from_dict

        for row in memory_plan(config_from_dict(entry["config"])):
            cells = [f"{row['tokens']:,}", row["experiment"], f"{row['weights_gb']:.1f}",
                     f"{row['activations_gb']:,.1f}", f"{row['state_gb']:.1f}"]
            cells += ["does not fit (one layer's activations exceed a device)" if row[k] is None else row[k]
                      for k in ("devices_80gb", "devices_141gb")]
            print("| " + " | ".join(str(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
