"""``python -m phaseinterp.experiments remedy OUT STOP W/N [SEED ...] [--offsets O] [--kv-heads K] [--payload P]``:
deprecated, runs ``phaseinterp experiments remedy ...`` (the same arguments; `phaseinterp.cli.commands`).
"""

import sys


def main(argv: list[str]) -> int:
    from phaseinterp.cli import run_moved

    return run_moved("phaseinterp.experiments", ["experiments", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
