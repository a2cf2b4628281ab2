"""Record (or compare) experiment records across a change: phase_profile, ablate (layer 0) and gate cycling
(shift 1), 72 prompts per residue, on w4s4 and dsv4-tiny. Every per-prompt array must be bit-identical.

python benchmarks/experiment_records_identity.py record|compare [--slot]
(record at the commit before a change, e.g. in a ``git worktree`` with PYTHONPATH pointing at it; compare
after; the reference lives in the git-ignored runs/records/). Written with keyword options only, so it runs
on 0.2 and 0.3 alike; labels (``model_label``) are not compared, 0.3 changed them on purpose.
A record that differs is listed column by column (how many values, the largest float difference).
``--slot`` runs the own family's attention on the explicit softmax (what a score or pattern hook sees;
patched in here, as if such a hook were attached), as before the fused kernel.
"""
import dataclasses
import pickle
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import phaseinterp as pi

OUT = Path("runs/records/reference_records.pkl")


def arrays(result) -> dict:
    return {f.name: np.asarray(getattr(result, f.name)) for f in dataclasses.fields(result)
            if isinstance(getattr(result, f.name), (np.ndarray, torch.Tensor))}


def run_all() -> dict:
    warnings.simplefilter("ignore", DeprecationWarning)  # 0.2's gate_cycling name, where this runs on 0.3
    torch.set_num_threads(1)
    out = {}
    for name in ("w4s4", "dsv4-tiny"):
        model = pi.zoo.load(name)
        task = pi.zoo.task_for(model)
        out[name, "profile"] = pi.phase_profile(model, task, n_per_residue=72, progress=False).records
        out[name, "ablate"] = arrays(pi.ablate(model, task, layer=0, n_per_residue=72, progress=False))
        cycling = getattr(pi, "gate_cycling_profile", None) or pi.gate_cycling
        out[name, "cycle"] = arrays(cycling(model, task, shifts=[1], n_per_residue=72, progress=False))
    return out


def same(before, after) -> bool:
    if isinstance(before, pd.DataFrame):
        columns = [c for c in before.columns if c != "model_label"]
        return list(before.columns) == list(after.columns) and all(
            np.array_equal(before[c].to_numpy(), after[c].to_numpy()) for c in columns)
    return before.keys() == after.keys() and all(np.array_equal(before[f], after[f]) for f in before)


def differences(before, after) -> str:
    """Where two records differ: per column, the count of differing values, and for floats the largest
    absolute difference."""
    if isinstance(before, pd.DataFrame):
        pairs = {c: (before[c].to_numpy(), after[c].to_numpy()) for c in before.columns if c != "model_label"}
    else:
        pairs = {f: (before[f], after[f]) for f in before}
    out = []
    for name, (a, b) in pairs.items():
        if a.shape != b.shape:
            out.append(f"{name}: shape {a.shape} -> {b.shape}")
        elif not np.array_equal(a, b):
            n = int((a != b).sum())
            if a.dtype.kind == "f":
                out.append(f"{name}: {n} differ, max |diff| {float(np.nanmax(np.abs(a - b))):.2e}")
            else:
                out.append(f"{name}: {n} of {a.size} differ")
    return "; ".join(out)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--slot"]
    if len(args) != 1 or args[0] not in ("record", "compare"):
        sys.exit(f"usage: python {sys.argv[0]} record|compare [--slot] (got {sys.argv[1:]})")
    mode = args[0]
    if "--slot" in sys.argv[1:]:
        from phaseinterp.models.attention import CompressedAttention

        CompressedAttention._scores_hooked = lambda self: True
    res = run_all()
    if mode == "record":
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_bytes(pickle.dumps(res))
        print("recorded", list(res))
    else:
        ref = pickle.loads(OUT.read_bytes())
        ok = ref.keys() == res.keys()
        for key in ref:
            equal = same(ref[key], res[key])
            n = len(ref[key]["residue"])  # one row per prompt in the records and in every result
            print(f"{key[0]:10s} {key[1]:8s} prompts={n} bit-identical={equal}"
                  + ("" if equal else f"  ({differences(ref[key], res[key])})"))
            ok &= equal
        print("ALL OK" if ok else "MISMATCH")
