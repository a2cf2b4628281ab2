"""Costs the demo used to pay per use, side by side: PNG export, the browser start, the target placement.

    python benchmarks/demo_parts.py [--figures 7] [--repeats 3]

(a) ``--figures`` small plotly figures written as PNG one kaleido session per figure
(`phaseinterp.plot.export.save`, what the report did) vs all in one session
(`export.save_static`), and that session's export when the browser was started earlier in the
background (`export.static_session`, what the report does now: it starts the browser when the
report starts; here the head start is the time the cold start took). Needs kaleido and a Chromium.
(b) ``task.generate(250, seed=0)`` on the zoo task with the placement solved afresh (cache
cleared) vs taken from the cache (`tasks.retrieval._cached_placement`): the report asks for the
same prompt set in several sections; `report.PromptSets` now generates it once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figures", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import plotly.graph_objects as go

    import phaseinterp as pi
    from phaseinterp.plot import export
    from phaseinterp.tasks import retrieval

    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    figures = [go.Figure(go.Scatter(y=[1, 3, 2], name=f"f{i}")) for i in range(args.figures)]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        for i, fig in enumerate(figures):
            export.save(fig, Path(tmp) / f"each{i}.png")
        each = time.perf_counter() - t0
        t0 = time.perf_counter()
        export.save_static({Path(tmp) / f"one{i}.png": fig for i, fig in enumerate(figures)})
        one = time.perf_counter() - t0
        t0 = time.perf_counter()
        with export.static_session():
            time.sleep(one)  # the work a report does before its PNGs, here idle
            t1 = time.perf_counter()
            export.save_static({Path(tmp) / f"warm{i}.png": fig for i, fig in enumerate(figures)})
            warm = time.perf_counter() - t1
        same = all((Path(tmp) / f"warm{i}.png").read_bytes() == (Path(tmp) / f"one{i}.png").read_bytes()
                   for i in range(len(figures)))
    print(f"| PNG export, {args.figures} figures | one kaleido session per figure {each:.1f} s | "
          f"one session for all {one:.1f} s | {each / one:.1f}x |")
    print(f"| PNG export, {args.figures} figures | one session, browser started at export {one:.1f} s | "
          f"browser started earlier (static_session) {warm:.1f} s | {one / warm:.1f}x (PNG bytes identical: "
          f"{'yes' if same else 'NO'}) |")

    task = pi.zoo.task_for(pi.zoo.load("w4s4"))
    fresh, cached = [], []
    for _ in range(args.repeats):
        retrieval._cached_placement.cache_clear()
        t0 = time.perf_counter()
        task.generate(250, seed=0)
        fresh.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        task.generate(250, seed=0)
        cached.append(time.perf_counter() - t0)
    f, c = statistics.median(fresh), statistics.median(cached)
    print(f"| generate(250, seed=0), 6,000 prompts | placement solved {f:.2f} s | placement cached {c:.2f} s | "
          f"{f / c:.1f}x (median of {args.repeats}) |")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
