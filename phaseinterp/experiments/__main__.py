"""python -m phaseinterp.experiments remedy OUT STOP W/N [SEED ...]: one worker's share of the remedy runs.

Trains the baseline and staggered twins of `compare_remedy` (seeds 0 1 2 unless given), each
to STOP steps of the zoo recipe, in OUT/<variant>_seed<seed>; worker W of N takes every N-th
run, so N processes (one thread each) train the set in parallel. Runs resume where they stopped.
"""

import sys


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "remedy" or "/" not in argv[3]:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    import torch

    from phaseinterp.experiments.remedy import train_share

    torch.set_num_threads(1)
    try:
        stop = int(argv[2])
        worker, n_workers = (int(x) for x in argv[3].split("/"))
        seeds = tuple(int(s) for s in argv[4:]) or (0, 1, 2)
    except ValueError:
        print(f"error: STOP, W/N and seeds must be integers (got {argv[2:]})", file=sys.stderr)
        return 2
    train_share(argv[1], stop, worker, n_workers, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
