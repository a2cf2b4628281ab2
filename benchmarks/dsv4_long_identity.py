"""Record (or compare) the chunked DeepSeek-V4 forward's numbers across a change, at long prompts.

    python benchmarks/dsv4_long_identity.py record|compare [--lengths 300 3000 8192]

`benchmarks/dsv4_long.py`'s model (random weights, the published attention settings), one prompt per
length: the last 64 positions' logits of `run_with_cache`, of the plain forward and `last_logits`, and
every layer's ``attn.hook_z`` and CSA ``indexer.hook_selected``. ``record`` at the commit before a change
(a ``git worktree`` on ``PYTHONPATH``), ``compare`` after: each tensor bit-identical, or its max |diff|
and that relative to its largest |value| (for ``hook_selected``: how many indices differ). The reference
lives in the git-ignored runs/dsv4_long_identity/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from dsv4_long import build  # noqa: E402

OUT = Path("runs/dsv4_long_identity/reference.pt")


def tensors(lengths) -> dict:
    model = build()
    out = {}
    wanted = lambda name: name.endswith("hook_selected") or name.endswith("attn.hook_z")  # noqa: E731
    for T in lengths:
        tokens = torch.randint(0, model.cfg.d_vocab, (1, T), generator=torch.Generator().manual_seed(T))
        with torch.no_grad():
            logits, cache = model.run_with_cache(tokens, names_filter=wanted)
            out[f"T={T} logits"] = logits[:, -64:].clone()
            out.update({f"T={T} {name}": value.clone() for name, value in cache.items()})
            out[f"T={T} plain forward"] = model(tokens)[:, -64:].clone()
            out[f"T={T} last_logits"] = model.last_logits(tokens).clone()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("record", "compare"))
    parser.add_argument("--lengths", type=int, nargs="+", default=[300, 3000, 8192])
    args = parser.parse_args()
    torch.set_num_threads(2)
    now = tensors(args.lengths)
    if args.mode == "record":
        OUT.parent.mkdir(parents=True, exist_ok=True)
        torch.save(now, OUT)
        print(f"recorded {len(now)} tensors to {OUT}")
        return
    if not OUT.exists():
        raise SystemExit(f"no reference at {OUT}: run `record` at the commit before the change first")
    reference = torch.load(OUT)
    same = 0
    for key, ref in reference.items():
        if key not in now:
            print(f"{key:60s} missing (recorded at another --lengths?)")
            continue
        new = now[key]
        if torch.equal(ref, new):
            same += 1
            print(f"{key:60s} bit-identical")
        elif ref.dtype == torch.long:
            print(f"{key:60s} {int((ref != new).sum())} of {ref.numel()} indices differ")
        else:
            diff = float((ref - new).abs().max())
            print(f"{key:60s} max|diff|={diff:.2e} relative={diff / float(ref.abs().max()):.1e}")
    print(f"{same} of {len(reference)} bit-identical")


if __name__ == "__main__":
    main()
