"""A hook is the intervention: one unit's mean replacement at the answer position, three ways.

    python benchmarks/hook_fast_path.py [--models w4s4 deep12-w8s8-1kv-shared-equal dsv4-tiny ...]
                                        [--batch 64] [--repeats 5] [--threads 1]

On the same prompt batch of each zoo model (its own task, seed 0, cut at the answer position), for
the query heads of KV head 0 of the middle layer, alternated ``--repeats`` times (the machine is
shared), median seconds:

1. built-in: `ablate`'s fast engine for that one unit (`knockout_measures`: the prefix once, the
   answer position clean and knocked out; the replacement is `mean_replacement_hook` on ``hook_z``);
2. user hook, fast path: the same replacement written as a plain ``hook_z`` hook under
   ``model.hooks`` around ``model.last_logits(tokens)``: the last-position path (``path_counts``);
3. user hook, full path: the same hook with ``last_logits(tokens, path="full")``, the full forward
   (what ``run_with_hooks`` runs), the hook seeing every position.

Ratios: user fast / built-in (the built-in also computes the clean answer) and full / user fast. The
max |difference| of the user's fast and full answer logits is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("PHASEINTERP_NO_PROGRESS", "1")

import pandas as pd  # noqa: E402
import torch  # noqa: E402

import phaseinterp as pi  # noqa: E402
from phaseinterp.interventions._common import fixed_answer_position  # noqa: E402
from phaseinterp.interventions.knockout import calibration_mean_z, knockout_measures  # noqa: E402
from phaseinterp.models.protocol import phase_model  # noqa: E402
from phaseinterp.tasks import resolve_task  # noqa: E402

DEFAULT_MODELS = ("w4s4", "w8s8-4kv", "deep12-w8s8-1kv-shared-equal", "dsv4-tiny")


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--batch", type=int, default=64, help="prompts per forward")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}, {args.batch} prompts, one unit (KV head 0 of the middle "
          f"layer), median of {args.repeats}")
    print("| model | layer | tokens | built-in ablate (s) | user hook_z, fast path (s) | user hook_z, full path (s) "
          "| fast / built-in | full / fast | fast vs full max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        model = pi.load(name)  # either family: the one loader
        task = resolve_task(model)
        prompts = task.generate(4, seed=0, strict=False)
        answer_pos = fixed_answer_position(prompts)
        tokens = prompts.tokens[: args.batch, : answer_pos + 1]
        answer = torch.as_tensor(prompts.answer)[: args.batch]
        layer = model.cfg.n_layers // 2
        heads = list(phase_model(model).knockout_point(layer, 0).query_heads)
        mean_z = calibration_mean_z(model, task.calibration(task.residue_modulus, seed=1).tokens, answer_pos)
        units = pd.DataFrame([dict(layer=layer, kv_head=0, heads=tuple(heads))])
        hook_name = f"blocks.{layer}.attn.hook_z"

        def mean_replace(z, hook):  # a user's hook: the answer is the last position
            z = z.clone()
            z[:, -1, heads] = mean_z[layer, heads].to(z.dtype)
            return z

        def user(path: str):
            with model.hooks(fwd_hooks=[(hook_name, mean_replace)]):
                return model.last_logits(tokens, path=path)

        built_t, fast_t, full_t = [], [], []
        with torch.inference_mode():
            for _ in range(args.repeats):
                counts = dict(model.path_counts)
                built_t.append(timed(lambda: knockout_measures(model, tokens, answer_pos, answer, units, mean_z,
                                                               batch_size=len(tokens)))[0])
                t, fast = timed(lambda: user("auto"))
                fast_t.append(t)
                t, full = timed(lambda: user("full"))
                full_t.append(t)
                ran = {k: model.path_counts[k] - counts.get(k, 0) for k in ("last_position", "full")}
                assert ran["full"] == 1 and ran["last_position"] >= 2, ran  # each ran the path it names
        built, fast_s, full_s = (statistics.median(t) for t in (built_t, fast_t, full_t))
        diff = float((fast.float() - full.float()).abs().max())
        print(f"| {name} | {layer} | {tokens.shape[1]} | {built:.4f} | {fast_s:.4f} | {full_s:.4f} "
              f"| {fast_s / built:.2f} | {full_s / fast_s:.2f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
