"""``phaseinterp paper --out DIR``: every figure of the paper's published numbers as HTML and PNG, on one page."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Union

import plotly.graph_objects as go
import plotly.io as pio

from phaseinterp import paper
from phaseinterp._files import check_write_target, write_dir_atomically
from phaseinterp.plot import export
from phaseinterp.plot.mechanisms import specialization_heatmap
from phaseinterp.plot.paper import concentration_figure, needles_figure, runs_figure


# ------------------------------------------------------------------ every figure the data supports
def paper_figures() -> dict[str, tuple[str, go.Figure]]:
    """Every figure the published numbers support, ``{file stem: (heading, figure)}``: the DeepSeek
    needles by residue; the 23 controlled runs beside the baselines (prefix and in-sequence padding);
    the knockout maps (the knockout figure's full-attention and DeepSeek maps, and every controlled
    run's prefix map, drawn by `specialization_heatmap` as `ablate`'s); gates beside knockouts (9 runs);
    gate cycling observed against predicted (5 runs); the concentration plane."""
    runs = paper.runs()
    figures: dict[str, tuple[str, go.Figure]] = {}
    needles = [paper.profile(r) for r in runs[runs.kind == "DeepSeek"].id]
    figures["needles"] = ("DeepSeek-V4 and V4.1 needles by residue (128K tokens)", needles_figure(needles))
    baselines = [paper.profile(r) for r in runs[runs.kind == "full attention"].id]
    controlled = runs[runs.kind == "controlled"]
    for padding in ("prefix", "in-sequence"):
        groups: dict[str, list] = {}
        for r in controlled.itertuples():
            groups.setdefault(r.group, []).append(paper.profile(r.id, padding, n_permutations=199))
        figures[f"runs_{padding.replace('-', '_')}"] = (
            f"The 23 controlled runs beside full attention ({padding} padding)", runs_figure(groups, baselines, padding))
    for run in ["full_attn_1kv", "flash_base"] + list(controlled.id):
        result = paper.knockout(run)
        fig = specialization_heatmap(result, level="phase" if run != "flash_base" else "residue")
        units = len(result.units)
        if units > 40:  # 8 KV heads x 28 layers: rows of 12 px keep the map on a page
            fig.update_layout(height=12 * units + 260)
        figures[f"knockout_{run}"] = (f"Knockout map: {result.model_label}", fig)
    for run in dict.fromkeys(paper.table("gates").run):
        g = paper.gates(run)
        figures[f"gates_{run}"] = (f"Gates beside knockouts: {g.model_label}", g.plot())
    for run in paper.cycling_runs().id:
        c = paper.cycling(run)
        figures[f"cycling_{run}"] = (f"Gate cycling, observed against predicted: {c.model_label}", c.plot())
    figures["concentration"] = ("The concentration plane", concentration_figure(paper.concentration(),
                                                                                 paper.trajectory()))
    return figures


def write_paper_figures(out: Union[str, Path], *, static: bool = True, overwrite: bool = False) -> dict:
    """Write ``out/index.html`` (every figure on one page), one ``<name>.html`` per figure (all of them
    loading ``plotly.min.js``, written beside them: offline), ``<name>.png`` per figure when ``static`` (kaleido + a local Chromium; `ExportError`
    when missing) and ``summary.json`` (the figures, the files, the source of the numbers). The folder
    is written whole and atomically; a previous one is replaced only with ``overwrite``."""
    target = check_write_target(out, "report", overwrite=overwrite, name="--out")
    figures = paper_figures()
    src = paper.source()

    def write(folder: Path) -> None:
        parts, listed = [], []
        for i, (name, (heading, fig)) in enumerate(figures.items()):
            # plotly.js once, beside the pages (offline, and 4 MB instead of 4 MB per figure)
            pio.write_html(fig, folder / f"{name}.html", include_plotlyjs="directory", full_html=True)
            parts.append(f"<h2 id='{name}'>{html.escape(heading)}</h2>\n"
                         + pio.to_html(fig, full_html=False, include_plotlyjs="directory" if i == 0 else False,
                                       div_id=f"fig-{name}"))
            listed.append(dict(name=name, heading=heading, html=f"{name}.html", png=f"{name}.png" if static else None))
        if static:
            export.save_static({folder / f"{name}.png": fig for name, (_, fig) in figures.items()})
        cite = (f"{src['repository']}@{src['commit'][:10]}, {src['file']} (figdata.json sha256 "
                f"{src['figdata_sha256'][:16]}...)")
        page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>The paper's figures (phaseinterp)</title>"
                "<style>body{font-family:Helvetica,Arial,sans-serif;max-width:1320px;margin:20px}</style></head><body>"
                "<h1>Periodic weak spots: the paper's published numbers, drawn by phaseinterp</h1>"
                f"<p>Numbers: the figure data of the paper's interactive post ({html.escape(cite)}), shipped in "
                "phaseinterp/paper/data. Each figure is also a file beside this page.</p>"
                + "<ul>" + "".join(f"<li><a href='#{f['name']}'>{html.escape(f['heading'])}</a></li>" for f in listed)
                + "</ul>" + "\n".join(parts) + "</body></html>")
        (folder / "index.html").write_text(page, encoding="utf-8")
        (folder / "summary.json").write_text(json.dumps(dict(figures=listed, source=src), indent=1,
                                                        ensure_ascii=False) + "\n", encoding="utf-8")

    write_dir_atomically(target, write)
    return dict(figures=len(figures), out=str(target))
