"""How long `phaseinterp --help` and `phaseinterp COMMAND --help` take, beside what an eager
import would cost (torch + the toolkit), measured as fresh processes.

    python benchmarks/cli_help.py [--repeats 5]

Prints one row per command: median and max wall seconds over the repeats, and the median of
`python -c "import phaseinterp.interventions"` (what --help cost when the CLI imported the
toolkit eagerly) for the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = [[], ["demo"], ["report"], ["profile"], ["ablate"], ["cycle"], ["gates"], ["train"], ["zoo"],
            ["zoo", "list"], ["zoo", "build"]]


def _time(argv: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = subprocess.run(argv, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {out.stderr[-500:]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per command (default: 5)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats} must be >= 1")
    script = shutil.which("phaseinterp")
    base = [script] if script else [sys.executable, "-m", "phaseinterp.cli"]
    eager = statistics.median(_time([sys.executable, "-c", "import phaseinterp.interventions"], args.repeats))
    print(f"entry point: {' '.join(base)}; {args.repeats} runs each; eager toolkit import: {eager:.2f} s (median)")
    print("| command | median s | max s | eager import / median |")
    print("|---|---|---|---|")
    worst = 0.0
    for command in COMMANDS:
        times = _time(base + command + ["--help"], args.repeats)
        median = statistics.median(times)
        worst = max(worst, max(times))
        print(f"| `phaseinterp {' '.join(command + ['--help'])}` | {median:.3f} | {max(times):.3f} | "
              f"{eager / median:.0f}x |")
    print(f"slowest single run: {worst:.3f} s")


if __name__ == "__main__":
    main()
