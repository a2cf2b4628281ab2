"""The report page: ``index.html`` from the sections' summary, figures and tables, in house style
(meanings under every table, tidy tables, figures told apart by dash and marker, not colour alone)."""

from __future__ import annotations

import html
import os
import re

import plotly.io as pio
import torch
from plotly.offline import get_plotlyjs

from phaseinterp._checks import check_int
from phaseinterp.plot.compare import DASHES, SYMBOLS


def num(value) -> str:
    return "n/a" if value is None or value != value else f"{value:.3f}"


def frame_html(frame, caption: str, max_rows: int = 40) -> str:
    max_rows = check_int("max_rows", max_rows, 1, why=" (rows shown; the rest are in the CSV)")
    shown = frame.head(max_rows)
    more = f"<p>... {len(frame) - max_rows} more rows in the CSV</p>" if len(frame) > max_rows else ""
    return f"<h3>{html.escape(caption)}</h3>" + shown.to_html(index=False, border=0, float_format=fmt) + more


def fmt(value: float) -> str:
    return f"{value:.3g}"


def period_words(profile: dict, undetermined: str = "undetermined at this design") -> str:
    """A profile's (`PhaseProfile.to_dict`) period: the number, ``undetermined`` or "none"."""
    if profile["period"] is not None:
        return profile["period"]
    return undetermined if str(profile.get("period_verdict", "")).startswith("undetermined") else "none"


def table_html(header, rows, left=(0,)) -> str:
    """A product table: ``header``, then one ``<tr>`` per row of ``rows`` (cells as given: escape text first),
    the columns ``left`` aligned left (names, words), the others right (numbers)."""
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{c}</td>" if i in left else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return "<table><tr>" + "".join(f"<th>{h}</th>" for h in header) + f"</tr>{body}</table>"


# One line per statistic the report shows (a table column or row label): the report prints the
# meaning of each one that appears in a section, right under that section's tables.
MEANINGS: dict[str, str] = {
    "axis": "which position the profile varies: the target's phase ('target') or the prompt length's ('length')",
    "period": "the period the profile repeats with (permutation test); 'none' means no period is significant",
    "homogeneity p": "p-value of the test that accuracy is the same in every cell of the row; small = it differs",
    "premise": "whether the experiment's assumptions held on this run ('holds'), or 'PREMISE FAILS'",
    "premise_notes": "each assumption that failed, in words: while any is listed, the scores are no evidence",
    "identification": "whether the run identifies the claimed unit or mechanism, or why it is not claimed",
    "mean": "top-1 accuracy over all prompts, every phase weighted equally by design (1.0 = every answer right)",
    "worst phase": "the phase with the lowest accuracy, and that accuracy in brackets",
    "phase gap": "best minus worst accuracy across phases, in percentage points: 0 means phase does not matter",
    "residue gap": "best minus worst accuracy across the R residues (position mod R); noisier than the phase gap, "
                   "since each residue has fewer prompts",
    "period (p)": "the period the residue profile repeats with, and the permutation-test p-value that it is "
                  "chance; 'none' means no period is significant",
    "n_prompts": "prompts measured (every residue group equally)",
    "scope": "what one replaced unit is: one KV head (with its query heads) or a whole layer",
    "shifts": "the gate shifts applied, in slots (distinct mod S)",
    "clean_accuracy": "accuracy with nothing replaced (the baseline every relative change is measured against)",
    "specialized_heads": "units whose knockout hurts (significantly, by at least 50% of the clean accuracy) only "
                         "at 1 to 3 adjacent phases, with those phases",
    "multi_phase_units": "units that hurt phases that are not adjacent, or more than 3 of them",
    "test": "the significance test behind 'hurt', corrected for testing every unit at every phase",
    "heads": "the query heads that read this KV head (all are replaced together)",
    "phases": "the longest run of adjacent phases the unit's knockout hurts",
    "n_phases": "how many phases are in that run (0: the unit serves no phase on its own)",
    "contiguous": "True when every hurt phase lies in that one run",
    "concentration": "the share of the unit's total relative loss that falls on that run (1 = all of it)",
    "worst_change": "the largest relative drop of accuracy, % of the clean accuracy (-100 = wiped out)",
    "worst_change_pp": "the same drop in percentage points of accuracy",
    "hurt_phases": "every phase where the knockout hurts, adjacent or not",
    "preferred_slot": "the window slot the gate puts the most weight on, averaged over the task's windows",
    "static_preferred_slot": "the slot the gate's parameters alone favour (softmax of the bias / position_bias)",
    "static_concentration": "effective number of slots of the average gate, exp(entropy): 1 = one slot, W = uniform",
    "window_concentration": "effective number of slots per window, averaged: how peaked each single gate is",
    "bias_concentration": "effective number of slots of the parameters-only gate",
    "rate": "for the indexer: the share of prompts whose target entry the indexer keeps (the metric column "
            "names which); for DeepSeek-V4 layers: tokens per compressed entry",
    "slots_per_entry": "tokens each compressed entry reads (its window)",
    "lower": "lower end of the 95% Wilson interval of the rate",
    "upper": "upper end of the 95% Wilson interval of the rate",
    "value_selected_rate": "share of prompts where an entry holding the answer token is among the indexer's top k",
    "key_selected_rate": "the same for the target key token",
    "pair_selected_rate": "share of prompts where one selected entry holds both key and answer",
    "mean_value_rank": "average rank of the best entry holding the answer among the closed entries (0 = top)",
    "mean_closed": "average number of closed compressed entries the indexer chooses from",
    "worst_phase_accuracy": "accuracy at the worst phase (%)",
    "boundary_phases": "the phases at the KV heads' own window boundaries (the last slot of a window)",
    "boundary_accuracy": "accuracy at each of those boundary phases (%)",
    "stored_bytes_per_token": "KV-cache bytes per token this implementation holds after n_ctx tokens (K and V)",
    "section": "a part of this report, in the order it ran (Run time table)",
    "seconds": "wall-clock seconds that part took on this machine, models loaded once at the start",
    "closed_bytes_per_token": "the same, counting only entries whose window has closed",
    "window_offset": "where the KV head's window grid starts (0 = the shared grid)",
    "boundary_phase": "that KV head's boundary phase: (offset + S - 1) mod S",
    "r2_pooled": "R² = 1 - SS_res/SS_tot of the parameter-free prediction over every shift's interior phases; 1 = "
                 "exact, 0 = no better than the mean change, negative = worse than that",
    "r2_by_shift": "the same R² for each shift alone (S - 1 points each)",
    "corr2_pooled": "squared correlation of predicted and observed changes (a fitted line: slope and intercept "
                    "free)",
    "movement_r2": "the paper's figure: did the weak spot (or the unit's peak) move by the applied shift? R² = "
                   "1 - sum (displacement - shift)^2 / sum (displacement - mean)^2 over the shifts, one point each; "
                   "-inf when the spot never moved",
    "movement_r2_ci": "95% bootstrap interval of the movement R² (prompts resampled within residue groups)",
    "movement_corr2": "squared correlation of displacement with applied shift (a fitted line)",
    "displacement_ci_by_shift": "95% bootstrap interval of each shift's measured displacement (slots)",
    "corr2_by_shift": "the same per shift",
    "r2_all_by_shift": "R² on every phase including the boundary phase (the boundary stays weak under every shift, "
                       "so this is usually low)",
    "r2_interior_by_shift": "R² leaving out both boundary phases; with S = 4 it rests on 2 points, so it can be "
                            "hugely negative when the observed changes are nearly equal",
    "mae_by_shift": "mean absolute error of the predicted accuracy changes",
    "mean_drop_by_shift": "how much the mean accuracy falls under the shift",
    "displacement_by_shift": "the hypothesised shift that explains the observed profile best, in (-S/2, S/2]: "
                             "where the weak spot went",
    "identified": "how many applied shifts are the best of the S hypotheses",
    "identification_p": "permutation p-value of identifying that many shifts by chance",
    "identification_p_by_shift": "the same p-value per shift",
    "identification_p_min_attainable": "the smallest p-value the pooled identification test can reach with these "
                                       "shifts (1/(S-1)! per shift); above 0.05 it cannot say yes",
    "identification_by_shift": "why the per-shift identification is not read at this design (its smallest "
                               "attainable p is above 0.05); read the pooled test instead",
    "boundary_rank_by_shift": "rank of the boundary phase's accuracy under the shift (0 = the weakest phase)",
    "points_per_shift": "phases each per-shift score rests on",
    "hypothesised shift": "columns 0..S-1: R² of the hypothesis that the unit's phase moved by that many slots "
                          "(its contribution C_0((r - d') mod S) against the observed one)",
    "best": "the hypothesised shift that fits the observed contribution best (smallest residual)",
    "kind": "conformance: 'answer' rows group prompts by the answer position's phase, 'cut' rows by the phase "
            "at which the prefill was cut",
    "max_abs_diff": "the largest |difference| of next-token log-probs between this implementation and the full "
                    "forward, over the vocabulary and the prompts of that phase",
    "mean_abs_diff": "the same difference averaged over the vocabulary and the prompts",
    "agreement": "share of prompts whose top-1 next token is the same as the full forward's",
    "accuracy_diff": "answer accuracy of this implementation minus the full forward's (0 = same answers)",
    "statistic": "which difference the verdict reads (max or mean |d log p|)",
    "tolerance": "the largest value of that statistic that passes",
    "passed": "True when the statistic is within the tolerance at this phase",
    "prompts per residue": "prompts measured per residue group (x R residues in all); the default is 72, "
                           "--full takes 250",
    "best phase": "the phase with the highest accuracy",
    "worst-phase interval": "the 95% interval of the worst phase's accuracy",
    "best-phase interval": "the 95% interval of the best phase's accuracy",
    "verdict": "'separated': the two intervals do not overlap, so the phase gap is resolved at this size; "
               "'overlapping': no phase gap this many prompts can resolve (a flat profile reads so; --full "
               "resolves gaps about 1.9 times smaller)",
    "source": "measured: this model on this report's prompts; published: the paper's own numbers "
              "(phaseinterp.paper, prefix padding)",
    "geometry": "compression window W, stride S and KV heads per layer (full attention: KV heads only)",
    "variant": "what the published run changes beyond its geometry ('baseline', 'geometry', 'KV heads': nothing)",
    "compared on": "the common residues and phases both profiles are folded to: the least common multiple of the two "
                   "strides, on the residues both have ('own': each on its own, not one statistic)",
    "chance": "the probability of identifying the applied shift by luck, exact over every arrangement of the S "
              "phase values (about 1/S)",
}


def meanings_html(section_html: str) -> str:
    """One line per statistic that appears as a table header in ``section_html``."""
    shown = {html.unescape(t).strip() for t in re.findall(r"<th[^>]*>(.*?)</th>", section_html, flags=re.S)}
    lines = [f"<li><b>{html.escape(term)}</b>: {html.escape(meaning)}</li>"
             for term, meaning in MEANINGS.items() if term in shown]
    return f"<details open class='meanings'><summary>What the numbers mean</summary><ul>{''.join(lines)}</ul></details>" \
        if lines else ""


READING_GUIDE = (
    "<h2>How to read this report</h2>"
    "<p>Models that compress their KV cache in chunks of S tokens (DeepSeek-V4 style) store a token inside one "
    "compressed entry, at some slot of its window. The token's <b>phase</b> is its position mod S: which slot of a "
    "window it falls in. Every experiment here asks whether retrieval depends on that phase. Each prompt lists "
    "key-value records and asks for the value of one key; the target record is moved through every residue "
    "(position mod R, R a multiple of S) while the prompt length and the mean and spread of target positions stay "
    "the same, so phase is the only thing that changes.</p>"
    "<p><b>Look first</b> at the summary table and the first figure: a compressed model with a phase effect has a "
    "large <i>phase gap</i> and a <i>worst phase</i> far below its mean, repeating with the stride as period; its "
    "full-attention twin (same backbone and training, no compression) should be flat. A good mean can hide a "
    "near-zero worst phase, so read both. <b>Beside the paper</b> sets that profile beside the paper's "
    "published runs of the same window, stride and KV heads (or the nearest ones, and says so). Then: "
    "<b>head x phase specialization</b> replaces one KV head at a time by "
    "its average output and shows at which phases accuracy drops (a head that matters at only one or two adjacent "
    "phases is phase-specialized); <b>gate cycling</b> rotates the compressor's gate parameters by d slots and "
    "tests the prediction that the weak spots move by d, first with every layer's gates rotated (the whole "
    "profile), then one unit at a time (does that unit's own contribution move with its gates?); "
    "<b>gate statistics</b> show which slot each gate "
    "weights most and how peaked it is. Sections after these cover a Hugging Face DeepSeek-V4 architecture "
    "and a remedy beyond the paper, when the report includes them. Under each table, 'What the numbers mean' "
    "defines every statistic it shows; every number is also in <code>data/*.csv</code> and "
    "<code>summary.json</code>.</p>")


def tidy_tables(text: str) -> str:
    """Product tables, whoever built them: no pandas header row that only names the index (its name
    moves into the corner cell), and no cell that reads None, nan or [] where a value belongs."""
    def header(match: re.Match) -> str:
        thead = match.group(0)
        rows = re.findall(r"<tr[^>]*>.*?</tr>", thead, flags=re.S)
        if len(rows) < 2:
            return thead
        cells = re.findall(r"<th[^>]*>(.*?)</th>", rows[-1], flags=re.S)
        if len(cells) < 2 or any(c.strip() for c in cells[1:]):
            return thead
        name = cells[0].strip()
        first = rows[0]
        corner = re.match(r"(<tr[^>]*>\s*<th[^>]*>)(.*?)(</th>)", first, flags=re.S)
        if corner and name:
            label = f"{name} \\ {corner.group(2).strip()}" if corner.group(2).strip() else name
            first = corner.group(1) + label + corner.group(3) + first[corner.end():]
        return thead.replace(rows[0], first).replace(rows[-1], "")

    text = re.sub(r"<thead>.*?</thead>", header, text, flags=re.S)
    text = re.sub(r"(?<![\w.])nan\b", "n/a", text)  # an undefined score (e.g. R² of a flat profile)
    text = re.sub(r"(<td[^>]*>)\s*(None|nan|NaN|&lt;NA&gt;)\s*(</td>)", r"\1n/a\3", text)
    return re.sub(r"(<td[^>]*>)\s*\[\]\s*(</td>)", r"\1none\2", text)


PAGE_WIDTH = 1150  # the page's max-width (px), set in page_html's style
FIGURE_WIDTH = PAGE_WIDTH - 50  # the widest figure: the column less padding and a scroll bar's room


def tidy_figure(fig) -> None:
    """House style for every report figure: at most `FIGURE_WIDTH` px wide (the page's column, so
    nothing sticks out: `phaseinterp.report.check`), integer ticks on phase and slot axes (phases
    are integers), and overlapping line series told apart by dash and marker, not colour alone."""
    layout = fig.layout
    if layout.width is not None and layout.width > FIGURE_WIDTH:
        layout.width = FIGURE_WIDTH
    if layout.title and layout.title.text:
        layout.title.text = re.sub(r"(?<![\w.])nan\b", "n/a", layout.title.text)  # an undefined score
    for annotation in layout.annotations or ():
        if annotation.text:
            annotation.text = re.sub(r"(?<![\w.])nan\b", "n/a", annotation.text)
    for name in [k for k in layout if k.startswith(("xaxis", "yaxis"))]:
        axis = layout[name]
        title = (axis.title.text or "").lower() if axis.title else ""
        is_position = re.search(r"\b(phase|slot)\b", title) and not re.search(r"gap|accuracy|rate|change|%", title)
        if is_position and axis.type not in ("category", "log"):
            axis.update(tick0=0, dtick=1)
    styles: dict[tuple, dict] = {}  # subplot -> series (legend group or name) -> style index
    for trace in fig.data:
        if trace.type != "scatter" or "lines" not in (trace.mode or "lines"):
            continue
        series = trace.legendgroup or (trace.name if trace.showlegend is not False else None)
        if series is None:
            continue  # an unnamed reference line (a diagonal, a mean)
        subplot = styles.setdefault((trace.xaxis or "x", trace.yaxis or "y"), {})
        i = subplot.setdefault(series, len(subplot))
        if i == 0:
            continue  # the first series keeps its style
        if not trace.line.dash:
            trace.line.dash = DASHES[i % len(DASHES)]
        if "markers" in (trace.mode or "") and not trace.marker.symbol:
            trace.marker.symbol = SYMBOLS[i % len(SYMBOLS)]


def page_html(summary: dict, figures: dict, tables: dict, static: dict) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>phaseinterp report</title>",
        "<style>body{font-family:Helvetica,Arial,sans-serif;max-width:" + str(PAGE_WIDTH) + "px;margin:24px auto;padding:0 12px;"
        "color:#222}table{border-collapse:collapse;margin:8px 0;display:block;max-width:100%;overflow-x:auto}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}h2{margin-top:36px}"
        ".note{background:#fff6e0;border-left:4px solid #e0a000;padding:6px 10px}"
        ".meanings{font-size:90%;color:#444;margin:6px 0 12px}.meanings ul{margin:4px 0}"
        ".plotly-graph-div{max-width:100%}</style>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
        f"<h1>phaseinterp report: {html.escape(summary['model'])}</h1>",
        "<p>Accuracy by target phase (position mod stride) with position statistics held fixed, "
        "per-KV-head mean replacement, cyclic gate shifts and gate statistics. Every number is in "
        "<code>data/*.csv</code> and <code>summary.json</code>.</p>",
        READING_GUIDE,
    ]
    if static.get("skipped"):
        parts.append(f"<p class='note'>PNG figures were not written: {html.escape(static['skipped'])}. "
                     "The interactive figures below and the CSVs hold everything.</p>")
    rows = []
    for p in summary["profiles"]:
        p_value = p["period_p_value"]
        rows.append((html.escape(p["label"]), f"{p['mean']:.3f}",
                     f"{','.join(map(str, p['worst_phases']))} ({p['worst_phase_accuracy']:.3f})",
                     f"{100 * p['phase_gap']:.1f} pp", f"{100 * p['gap']:.1f} pp",
                     f"{period_words(p)} ({'n/a' if p_value is None or p_value != p_value else f'{p_value:.3f}'})"))
    summary_table = "<h2>Summary</h2>" + table_html(
        ("model", "mean", "worst phase", "phase gap", "residue gap", "period (p)"), rows)
    parts.append(summary_table + meanings_html(summary_table))
    parts.append(resolution_html(summary))
    parts.append(settings_html(summary))
    parts.append(timing_html(summary))
    titles = {"phase_profile": "Accuracy by phase",
              "paper": "Beside the paper: the published runs of this model's geometry",
              "prompt_length": "Target phase x prompt-length phase (the model's weak spot follows the target; an "
                               "engine's length bug would follow the prompt's length)",
              "ablation_heatmap": "Head x phase specialization",
              "gate_cycling": "Gate cycling: every layer's gates shifted (whole-profile score)",
              "unit_cycling": "Gate cycling, one unit at a time (unit-level score)",
              "gate_profile": "Gate statistics",
              "dsv4_profile": "DeepSeek-V4 (Hugging Face architecture): accuracy by phase",
              "dsv4_indexer_phase": "DeepSeek-V4: phase through the Lightning Indexer",
              "remedy_profile": "Beyond the paper: staggered compression windows at equal memory",
              "conformance": "Conformance: decoding, chunked prefill and bfloat16 against the full forward, per phase"}
    for name, fig in figures.items():
        parts.append(f"<h2>{titles.get(name, name)}</h2>")
        parts.append(pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"fig-{name}"))
        if name in tables:
            section = tidy_tables(tables[name])
            parts.append(section + meanings_html(section))
        if f"{name}.png" in static.get("written", []):
            parts.append(f"<p><a href='{name}.png'>{name}.png</a></p>")
    if "cycling_skipped" in summary:
        parts.append(f"<h2>Gate cycling</h2><p class='note'>Skipped: {html.escape(summary['cycling_skipped'])}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def resolution_html(summary: dict) -> str:
    """Whether each profile's phase gap is resolved at the report's prompt count (``summary["resolution"]``)."""
    rows = summary.get("resolution") or []
    if not rows:
        return ""

    def interval(v):
        return f"[{100 * v[0]:.1f}%, {100 * v[1]:.1f}%]"

    verdict = ("<p>A model with overlapping intervals shows no phase gap this many prompts can resolve; "
               "<code>--full</code> reruns at 250 prompts per residue.</p>")
    table = "<h3>Are the intervals separated at this size?</h3>" + table_html(
        ("model", "prompts per residue", "worst phase", "worst-phase interval", "best phase", "best-phase interval",
         "verdict"), [(html.escape(r["model"]), r["n_per_residue"], r["worst_phase"], interval(r["worst_interval"]),
                       r["best_phase"], interval(r["best_interval"]), r["verdict"]) for r in rows], left=(0, 6))
    return table + verdict + meanings_html(table)


def timing_html(summary: dict) -> str:
    """The report's own run time and its split by section (``summary["section_seconds"]``)."""
    if "seconds" not in summary:
        return ""
    sections = summary.get("section_seconds", {})
    return (f"<h3>Run time</h3><p>This report took {summary['seconds']:.1f} s to build ({os.cpu_count()} CPU "
            f"cores visible, {torch.get_num_threads()} torch threads).</p>"
            + table_html(("section", "seconds"), [(html.escape(name), f"{sec:.1f}") for name, sec in sections.items()]))


def settings_html(summary: dict) -> str:
    """Model, task and run settings as small tables (the task without its vocabulary); the gate
    shifts are those that ran."""
    rows = []
    config = summary.get("config", {})
    for key in ("compression", "window", "stride", "gate", "payload", "n_layers", "n_heads", "n_kv_heads", "d_model"):
        if key in config:
            rows.append(("model", key, "none (full attention)" if key == "compression" and config[key] is None
                         else config[key]))
    task = summary.get("task")
    if isinstance(task, dict):
        for key, value in task.items():
            if key != "vocab" and not isinstance(value, (dict, list)):
                rows.append(("task", key, "none (no limit)" if value is None else value))
    for key, value in summary.get("settings", {}).items():
        if key == "shifts":
            cycling = summary.get("cycling")
            if cycling:
                value = (f"{', '.join(f'{d:+d}' for d in cycling['shifts'])} (on {cycling.get('model_used', cycling['model'])})")
            elif summary.get("cycling_skipped"):
                value = "gate cycling skipped (see its section)"
            else:
                value = "gate cycling not run (full-attention model)"
        rows.append(("run", key, value))
    return "<h3>Settings</h3>" + table_html(("what", "setting", "value"),
                                            [(a, html.escape(str(b)), html.escape(str(c))) for a, b, c in rows],
                                            left=(0, 1, 2))
