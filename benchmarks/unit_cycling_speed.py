"""Unit-level gate cycling: the layers below the shifted unit run once for every shift, vs once per shift.

    python benchmarks/unit_cycling_speed.py [--units deep12-w8s8-1kv-shared-equal:11 ...]
                                            [--n-per-residue 4] [--n-calibration 48] [--shifts -1 1 2]
                                            [--repeats 3] [--threads 1]

`gate_cycling_unit(model, ..., layers=[L])` measures, under each shift of layer ``L``'s
gates, the calibration mean of ``hook_z`` and the unit's knockout. Nothing below ``L`` changes
with the shift, so `phaseinterp.interventions.knockout.shifted_knockouts` runs layers ``0 .. L-1``
once per prompt batch for every shift (own family). This script times it beside the per-shift
loop it replaces (enter the shift; `calibration_mean_z`; `knockout_measures`), on the same
prompts, alternating the two ``--repeats`` times (the machine is shared), reports the median
ratio, and checks that the outputs are bit-identical. Shift 0 is always included (the unshifted
reference the score needs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import torch  # noqa: E402

import phaseinterp as pi  # noqa: E402
from phaseinterp.interventions._common import fixed_answer_position  # noqa: E402
from phaseinterp.interventions.gate_shifts import shift_gates  # noqa: E402
from phaseinterp.interventions.knockout import calibration_mean_z, knockout_measures, shifted_knockouts  # noqa: E402
from phaseinterp.interventions.unit_cycling import _layer_units  # noqa: E402

DEFAULT_UNITS = ("w4s4-1kv-shared:1", "deep12-w8s8-1kv-shared-equal:2", "deep12-w8s8-1kv-shared-equal:11")


def per_shift_loop(model, batch, pos, calib, units, layer, shifts, batch_size):
    out = []
    for d in shifts:
        with shift_gates(model, d, layers=[layer], branch="both", kv_heads=[0]):
            mean_z = calibration_mean_z(model, calib, pos, batch_size)
            out.append(knockout_measures(model, batch.tokens, pos, batch.answer, units, mean_z, batch_size))
    return out


def shared(model, batch, pos, calib, units, layer, shifts, batch_size):
    variants = [lambda d=d: shift_gates(model, d, layers=[layer], branch="both", kv_heads=[0]) for d in shifts]
    return shifted_knockouts(model, batch.tokens, pos, batch.answer, units, variants, calib, batch_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", nargs="+", default=list(DEFAULT_UNITS), help="MODEL:LAYER (KV head 0)")
    parser.add_argument("--n-per-residue", type=int, default=4, help="prompts per residue (not moment-matched)")
    parser.add_argument("--n-calibration", type=int, default=48)
    parser.add_argument("--shifts", type=int, nargs="+", default=[-1, 1, 2])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shifts = [0] + [d for d in args.shifts if d != 0]
    print(f"| unit | layers | prompts | shifts | per-shift loop (s, median) | shared lower layers (s, median) | "
          f"ratio (median of {args.repeats}) | bit-identical |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in args.units:
        name, layer = spec.rsplit(":", 1)
        layer = int(layer)
        model = pi.zoo.load(name)
        task = pi.zoo.task_for(model)
        batch = task.generate(args.n_per_residue, seed=0, strict=args.n_per_residue >= 72)
        pos = fixed_answer_position(batch)
        calib = task.calibration(args.n_calibration, seed=1).tokens[:, : pos + 1]
        units = _layer_units(model, [layer], [0])
        loop_s, shared_s, ratios, same = [], [], [], True
        for _ in range(args.repeats):
            t = time.perf_counter()
            a = per_shift_loop(model, batch, pos, calib, units, layer, shifts, args.batch_size)
            loop_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            b = shared(model, batch, pos, calib, units, layer, shifts, args.batch_size)
            shared_s.append(time.perf_counter() - t)
            ratios.append(loop_s[-1] / shared_s[-1])
            same &= all(torch.equal(getattr(x, f), getattr(y, f)) for x, y in zip(a, b) for f in x._fields)
        print(f"| {name} L{layer}H0 | {model.cfg.n_layers} | {len(batch)} | {shifts} | "
              f"{statistics.median(loop_s):.2f} | {statistics.median(shared_s):.2f} | "
              f"{statistics.median(ratios):.2f}x | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
