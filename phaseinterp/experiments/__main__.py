"""python -m phaseinterp.experiments remedy OUT STOP W/N [SEED ...] [--offsets O] [--kv-heads K] [--payload P]

Deprecated (one more release): ``phaseinterp experiments remedy`` takes the same arguments and runs
the same `train_share`.

One worker's share of the remedy runs: trains the baseline and staggered twins of
`compare_remedy` (seeds 0 1 2 unless given), each to STOP steps of the zoo recipe, in
OUT/<variant>_seed<seed>; worker W of N takes every N-th run, so N processes (one thread each)
train the set in parallel. Runs resume where they stopped. ``--offsets`` (default staggered;
staggered_layers for one-KV-head models), ``--kv-heads`` and ``--payload`` change both twins alike.
"""

import argparse
import sys
import warnings

import torch

from phaseinterp.experiments import remedy


def main(argv: list[str]) -> int:
    warnings.warn("`python -m phaseinterp.experiments` is deprecated and will be removed in the next release; "
                  "use `phaseinterp experiments remedy`", DeprecationWarning, stacklevel=2)
    parser = argparse.ArgumentParser(prog="python -m phaseinterp.experiments", description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=["remedy"])
    parser.add_argument("out")
    parser.add_argument("stop", type=int)
    parser.add_argument("share", help="W/N: worker W (0-based) of N")
    parser.add_argument("seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--offsets", default="staggered", choices=["staggered", "staggered_layers"])
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--payload", default=None, choices=["per_slot", "shared"])
    try:
        args = parser.parse_args(argv)
        worker, n_workers = (int(x) for x in args.share.split("/"))
    except SystemExit as exit_:
        return int(exit_.code or 0)
    except ValueError:
        print(f"error: W/N must be two integers (got {args.share!r})", file=sys.stderr)
        return 2

    torch.set_num_threads(1)
    architecture = {k: v for k, v in (("n_kv_heads", args.kv_heads), ("payload", args.payload)) if v is not None}
    try:
        remedy.train_share(args.out, args.stop, worker, n_workers, tuple(args.seeds), offsets=args.offsets,
                    architecture=architecture or None)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
