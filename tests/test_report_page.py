"""The report reads itself to a newcomer and renders in a real browser; the CLI's documented
behaviours (issue 25): comma lists, the command list, truthful interrupt messages, file modes,
a report folder replaced whole."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from phaseinterp import CompressedConfig, CompressedTransformer
from phaseinterp.cli import main
from phaseinterp.tasks import KeyValueRetrieval

ROOT = Path(__file__).resolve().parents[1]
TASK = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("page") / "model"
    cfg = CompressedConfig(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                           d_head=16, d_mlp=64, window=4, stride=4, local_window=8)
    model = CompressedTransformer(cfg)
    model.metadata.update(task=TASK.to_dict(), task_type="KeyValueRetrieval")
    model.save_pretrained(path)
    return path


def _settings(shifts=None):
    from phaseinterp.report import ReportSettings

    settings = ReportSettings.quick()
    settings.shifts, settings.export_static = shifts, False
    # the page's structure, not its statistics: 24 prompts per residue (R = 8) where quick() has 72
    settings.n_per_residue = settings.ablation_per_residue = settings.cycling_per_residue = 24
    settings.n_calibration = 32
    return settings


@pytest.fixture(scope="module")
def built(checkpoint, tmp_path_factory):
    """A quick report of the tiny model (every shift mod S: settings.shifts=None): (the `Report`, its folder)."""
    from phaseinterp.report import build_report

    out = tmp_path_factory.mktemp("page_report") / "r"
    return build_report(str(checkpoint), out, settings=_settings(), progress=False, log=lambda *_: None), out


@pytest.fixture(scope="module")
def report(built):
    """The folder of `built`'s report."""
    return built[1]


def _chromium_or_skip():
    from phaseinterp.plot.export import find_browser

    if find_browser() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must provide chromium")
        pytest.skip("chromium not installed")


@pytest.mark.slow  # spawns Chromium
# ------------------------------------------------------------- in the browser
def test_report_page_in_headless_chromium(report):
    """Every figure draws plot elements, nothing sticks out of a 1400 px page, no None/nan/[]."""
    from phaseinterp.report.check import check_page, problems

    _chromium_or_skip()
    result = check_page(report, width=1400)
    import re

    in_page = set(re.findall(r'<div id="(fig-[^"]+)"', (report / "index.html").read_text()))
    assert len(in_page) >= 4 and {f["id"] for f in result["figures"]} == in_page, (result["figures"], in_page)
    assert all(f["drawn"] >= 1 for f in result["figures"]), result["figures"]  # a heatmap is one image
    assert problems(result) == []


@pytest.mark.slow  # spawns Chromium
def test_browser_check_fails_on_a_broken_figure_and_an_overflowing_table(report, tmp_path):
    """The check sees the page, not its text: a figure that draws nothing and a table wider than
    the page without a scrolling box are both reported."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from phaseinterp.report.check import check_page, problems

    _chromium_or_skip()
    page = (report / "index.html").read_text()
    broken = pio.to_html(go.Figure(go.Scatter(x=[0, 1, 2], y=[None, None, None], mode="lines+markers")),
                         include_plotlyjs=False, full_html=False, div_id="fig-broken")
    wide = "<table style='display:table;overflow:visible'><tr>" + "".join(
        f"<td>column_{i}_with_a_long_name</td>" for i in range(60)) + "</tr></table>"
    bad = tmp_path / "index.html"
    bad.write_text(page.replace("</body>", f"{broken}{wide}<p>value: None</p></body>"))
    found = problems(check_page(bad, width=1400))
    assert "figure fig-broken drew no plot elements" in found, found
    assert any("px wide in a 1400 px window" in p for p in found), found
    assert any("column_0_with_a_long_name" in p for p in found), found
    assert "text says 'value: None'" in found, found
    assert not [p for p in found if "fig-phase_profile" in p or "fig-gate" in p], found  # the real ones still draw


LONG_TITLE = ("Mean replacement of z at the answer: w4s4 (W4/S4 gated, 2 KV heads) (* significant, Holm over "
              "units x phases)")


@pytest.mark.slow  # spawns Chromium
def test_browser_check_finds_a_cut_title_and_the_house_style_wraps_it(report, tmp_path):
    """A figure title plotly cuts at the figure's edge is a problem check-report names; the same
    title through the house style (`style`, which every mechanism figure uses) is wrapped and passes."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from phaseinterp.plot.mechanisms import style
    from phaseinterp.report.check import check_page, problems

    _chromium_or_skip()
    heat = go.Heatmap(z=[[1, -1, 0, 2], [0, 1, -2, 1]])
    cut = go.Figure(heat).update_layout(title=dict(text=LONG_TITLE, x=0.02), width=560, height=380)
    wrapped = style(go.Figure(heat), LONG_TITLE, width=560, height=380)
    page = (report / "index.html").read_text()
    parts = [pio.to_html(f, include_plotlyjs=False, full_html=False, div_id=i)
             for f, i in ((cut, "fig-cut"), (wrapped, "fig-wrapped"))]
    bad = tmp_path / "index.html"
    bad.write_text(page.replace("</body>", "".join(parts) + "</body>"))
    found = problems(check_page(bad, width=1400))
    assert any(p.startswith("figure fig-cut: title cut off") for p in found), found
    assert not [p for p in found if "fig-wrapped" in p or "title cut off" in p and "fig-cut" not in p], found


def test_long_titles_wrap_to_the_figure_width():
    from phaseinterp.plot.mechanisms import style, wrap_title

    lines = wrap_title(LONG_TITLE, 560)
    assert len(lines) >= 2 and " ".join(lines) == LONG_TITLE
    assert all(len(line) * 0.6 * 17 <= 560 for line in lines)
    assert wrap_title("short", 560) == ["short"] and wrap_title("a<br>b", 100) == ["a", "b"]
    import plotly.graph_objects as go

    fig = style(go.Figure(), LONG_TITLE, width=560)
    assert fig.layout.title.text.count("<br>") == len(lines) - 1 and fig.layout.margin.t > 70


# ----------------------------------------------------------- the page's text
def test_report_reads_itself(report):
    page = (report / "index.html").read_text()
    body = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    guide = body.index("How to read this report")
    assert guide < body.index("<h2>Summary</h2>") < body.index("fig-phase_profile")
    assert "phase" in body[guide: guide + 2000] and "Look first" in body[guide: guide + 3000]
    assert not re.search(r"\bissue \d+", body), "internal references in product text"
    assert "by at most 0." not in body
    # the Settings table shows the shifts that ran (every distinct shift mod 4), not []
    assert re.search(r"<td[^>]*>shifts</td><td[^>]*>-1, \+1, \+2 \(on ", body), body[body.index("Settings"):][:3000]
    # no pandas header row that only names the index
    for thead in re.findall(r"<thead>.*?</thead>", body, flags=re.S):
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", thead, flags=re.S):
            cells = re.findall(r"<th[^>]*>(.*?)</th>", row, flags=re.S)
            assert any(c.strip() for c in cells[1:]), f"empty header row: {row}"
    # every statistic shown as a table header has a one-line meaning in its section
    from phaseinterp.report.page import MEANINGS

    plain = {"model", "what", "setting", "value", "layer", "kv_head", "branch", "phase", "pair", "step",
             "compressed", "twin", "shift", "best", "p", "role", "type", "metric", "n", "slot"}
    headers = {re.sub(r"<.*?>", "", h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", body, flags=re.S)}
    unexplained = {h for h in headers if h and h not in MEANINGS and h not in plain and not h.lstrip("-").isdigit()
                   and "\\" not in h and "hypothesised" not in h}
    assert not unexplained, f"statistics without a meaning: {sorted(unexplained)}"
    assert body.count("What the numbers mean") >= 3


def test_identical_logits_are_called_identical():
    from phaseinterp.report.sections.deepseek_v4 import _logit_check_words

    def summary(diff, tied=0, apart=0):
        return {"wrapper_max_abs_logit_diff": diff, "indexer_rows_compared": 96, "indexer_rows_tied_apart": tied,
                "indexer_rows_apart": apart}

    assert "identical to plain transformers' (largest difference 0)" in _logit_check_words(summary(0.0))
    assert "within 3e-06 of plain transformers'" in _logit_check_words(summary(3e-6))
    assert "all 96 indexer rows up to exact ties (2 rows" in _logit_check_words(summary(0.0, tied=2))
    assert "beyond exact ties in 1 of 96 rows" in _logit_check_words(summary(0.0, tied=2, apart=1))


def test_report_figures_have_integer_phase_ticks_and_distinct_series(checkpoint, built):
    import plotly.graph_objects as go

    from phaseinterp.plot import profiles_figure
    from phaseinterp.profile import phase_profile
    from phaseinterp.report.page import tidy_figure

    rep = built[0]  # the module's report (built once), its figures copied: tidy_figure edits them in place
    model = CompressedTransformer.from_pretrained(checkpoint)
    p = phase_profile(model, TASK, n_per_residue=23, progress=False, n_permutations=19)
    figures = {name: go.Figure(fig) for name, fig in rep.figures.items()}
    figures["twins"] = profiles_figure([p, p])  # two identical profiles: one would hide the other
    for name, fig in figures.items():
        tidy_figure(fig)
        for key in [k for k in fig.layout if k.startswith(("xaxis", "yaxis"))]:
            axis = fig.layout[key]
            title = (axis.title.text or "").lower() if axis.title else ""
            if re.search(r"\bphase\b", title) and "gap" not in title and axis.type != "category":
                assert axis.dtick == 1, (name, key, title)
        styles: dict = {}
        for t in fig.data:
            if t.type == "scatter" and "lines" in (t.mode or "") and (t.legendgroup or t.showlegend is not False):
                styles.setdefault((t.xaxis, t.yaxis), {})[t.legendgroup or t.name] = (t.line.dash, t.marker.symbol)
        for subplot, series in styles.items():
            assert len(set(series.values())) == len(series), (name, subplot, series)


def test_data_file_names_come_from_the_model_name(report):
    from phaseinterp.report import data_name

    from types import SimpleNamespace

    assert data_name(SimpleNamespace(metadata={"zoo_name": "w4s4-staggered"}, cfg=None)) == "w4s4_staggered"
    names = sorted(p.name for p in (report / "data").glob("profile_*"))
    stems = {re.sub(r"_(residues|phases|prompts)\.csv$", "", n) for n in names}
    assert stems == {"profile_w4_s4_gated"}, names  # the plain model's config label, once


def test_refolding_a_compressed_model_is_labelled(checkpoint):
    from phaseinterp.profile import phase_profile

    model = CompressedTransformer.from_pretrained(checkpoint)
    batch = TASK.generate(23, seed=0)
    assert "re-folded" not in phase_profile(model, batch, progress=False, n_permutations=19).label
    refolded = phase_profile(model, batch, stride=2, progress=False, n_permutations=19, label="mine")
    assert "re-folded by S=2" in refolded.label and "own stride is 4" in refolded.label


@pytest.mark.slow  # builds the demo's report twice or more (file handling; the fast tier builds it once)
# ------------------------------------------------------------- report folder
def test_a_second_report_replaces_the_first_whole(checkpoint, tmp_path):
    from phaseinterp.report import build_report

    out = tmp_path / "r"
    build_report(str(checkpoint), out, settings=_settings((1,)), progress=False, log=lambda *_: None)
    (out / "phase_profile.png").write_bytes(b"a figure of another model")
    (out / "data" / "profile_other_model_phases.csv").write_text("stale")
    with pytest.raises(ValueError, match="already holds a report.*overwrite=True"):  # never replaced silently
        build_report(str(checkpoint), out, settings=_settings((1,)), progress=False, log=lambda *_: None)
    assert (out / "phase_profile.png").read_bytes() == b"a figure of another model"
    build_report(str(checkpoint), out, settings=_settings((1,)), progress=False, log=lambda *_: None, overwrite=True)
    assert not (out / "phase_profile.png").exists() and not (out / "data" / "profile_other_model_phases.csv").exists()
    assert (out / "index.html").is_file() and (out / "summary.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"], "staging or previous folders left behind"


@pytest.mark.slow  # builds the demo's report twice or more (file handling; the fast tier builds it once)
def test_an_interrupted_report_leaves_the_previous_one(checkpoint, tmp_path):
    from phaseinterp.report import build_report

    out = tmp_path / "r"
    build_report(str(checkpoint), out, settings=_settings((1,)), progress=False, log=lambda *_: None)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def interrupt(message):
        if message.startswith("[3/4]"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_report(str(checkpoint), out, settings=_settings((1,)), progress=False, log=interrupt, overwrite=True)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"], "the staging folder was left behind"


@pytest.mark.slow  # builds the demo's report twice or more (file handling; the fast tier builds it once)
# --------------------------------------------------------------- permissions
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_get_the_umask_permissions(umask, checkpoint, tmp_path):
    from phaseinterp._files import atomic_write_text
    from phaseinterp.report import build_report

    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "one.txt", "x")
        assert stat.S_IMODE((tmp_path / "one.txt").stat().st_mode) == 0o666 & ~umask
        if umask == 0o022:
            out = tmp_path / "r"
            build_report(str(checkpoint), out, settings=_settings((1,)), progress=False, log=lambda *_: None)
            for path in [out, *out.rglob("*")]:
                want = (0o777 if path.is_dir() else 0o666) & ~umask
                assert stat.S_IMODE(path.stat().st_mode) == want, (path, oct(path.stat().st_mode))
    finally:
        os.umask(old)


def test_training_checkpoints_get_the_umask_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        assert main(["train", "--out", str(tmp_path / "t"), "--steps", "2", "--batch-size", "4", "--n-layers", "1"]) == 0
    finally:
        os.umask(old)
    for path in (tmp_path / "t").rglob("*"):
        want = 0o755 if path.is_dir() else 0o644
        assert stat.S_IMODE(path.stat().st_mode) == want, (path, oct(path.stat().st_mode))


# ------------------------------------------------------------------- the CLI
def test_no_arguments_prints_the_command_list(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for command in ("demo", "report", "profile", "ablate", "cycle", "gates", "train", "zoo", "merge"):
        assert re.search(rf"^\s+{command}\s", out, flags=re.M), out
    assert main(["zoo"]) == 0 and "list" in capsys.readouterr().out


def test_shifts_and_layers_take_comma_lists():
    from phaseinterp.cli.args import build_parser

    args = build_parser().parse_args(["cycle", "m", "--shifts", "4,8", "-1", "--layer", "0,1"])
    assert args.shifts == [4, 8, -1] and args.layer == [0, 1]
    assert build_parser().parse_args(["cycle", "m", "--shifts", "1", "2"]).shifts == [1, 2]
    assert build_parser().parse_args(["ablate", "m"]).layer is None


@pytest.mark.parametrize("argv, says, never", [
    (["profile", "{ckpt}", "--n-per-residue", "23", "--out", "{tmp}/p"], ["nothing was written to"], ["checkpoint"]),
    (["profile", "{ckpt}", "--n-per-residue", "23"], ["interrupted"], ["checkpoint", "written"]),
    (["profile", "{ckpt}", "--n-per-residue", "23", "--shard-dir", "{tmp}/s"], ["finished shards in", "resume"],
     ["checkpoint"]),
    (["report", "{ckpt}", "--out", "{tmp}/r"], ["was not changed"], ["checkpoint"]),
    (["train", "--out", "{tmp}/t", "--steps", "2"], ["before the first checkpoint"], ["intact"]),
])
def test_interrupt_messages_say_what_is_true(argv, says, never, checkpoint, tmp_path, capsys, monkeypatch):
    from phaseinterp import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.commands, "run", interrupted)
    argv = [a.replace("{ckpt}", str(checkpoint)).replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert all(s in err for s in says) and not any(s in err for s in never), err


def test_interrupted_training_names_its_last_checkpoint(tmp_path, capsys, monkeypatch):
    from phaseinterp import cli

    assert main(["train", "--out", str(tmp_path / "t"), "--steps", "2", "--batch-size", "4", "--n-layers", "1"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(cli.commands, "run", lambda args: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["train", "--resume", "--out", str(tmp_path / "t"), "--steps", "2"]) == 130
    err = capsys.readouterr().err
    assert "step_000002" in err and "is intact" in err and "--resume" in err, err


# --------------------------------------------------------- README's picture
def test_readme_links_the_report_first_screen():
    """README shows the report's first screen: a committed small PNG, regenerated by the command
    README names (`phaseinterp screenshot ...`)."""
    readme = (ROOT / "README.md").read_text()
    link = re.search(r"!\[[^\]]*\]\((docs/[^)]+\.png)\)", readme)
    assert link, "README has no picture of the report"
    png = ROOT / link.group(1)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 20_000 < len(data) < 400_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 1000 and height >= 600
    assert "phaseinterp screenshot" in readme and link.group(1) in readme


@pytest.mark.slow  # spawns Chromium
def test_screenshot_command_writes_a_png(report, tmp_path):
    from phaseinterp.cli import main

    _chromium_or_skip()
    assert main(["screenshot", str(report), str(tmp_path / "first.png")]) == 0
    data = (tmp_path / "first.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == 1400


def test_previous_report_is_exchanged_in_one_atomic_step(tmp_path, monkeypatch):
    """On Linux a previous report is swapped with the new one by renameat2(RENAME_EXCHANGE): no
    instant without a report folder (no two-rename fallback is taken)."""
    import sys

    from phaseinterp._files import exchange_paths
    from phaseinterp.report import build as report

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "f").write_text("a"), (b / "f").write_text("b")
    if not sys.platform.startswith("linux") or not exchange_paths(a, b):
        pytest.skip("no atomic exchange on this system: the documented fallback is two renames")
    assert (a / "f").read_text() == "b" and (b / "f").read_text() == "a"
    final, staging = tmp_path / "report", tmp_path / ".report.building"
    final.mkdir(), staging.mkdir()
    (final / "index.html").write_text("old"), (staging / "index.html").write_text("new")
    import os

    monkeypatch.setattr(os, "replace", lambda *a, **k: pytest.fail("two renames were used"))
    report._replace_dir(staging, final)
    assert (final / "index.html").read_text() == "new" and not staging.exists()


def test_resolution_reads_separated_or_overlapping():
    """The report's size check: disjoint worst/best-phase intervals are 'separated' (the gap is
    resolved), touching or overlapping ones are not, whatever the point gap."""
    from phaseinterp.report.build import resolution

    def profile(label, worst, best, gap):
        return {"label": label, "n_per_residue": 72, "worst_phases": [3], "best_phase": 0, "phase_gap": gap,
                "worst_phase_interval": list(worst), "best_phase_interval": list(best)}

    rows = resolution([profile("a", (0.01, 0.04), (0.95, 0.99), 0.95), profile("b", (0.6, 0.7), (0.62, 0.72), 0.02),
                       profile("c", (0.4, 0.6), (0.6, 0.8), 0.2)])
    assert [r["verdict"] for r in rows] == ["separated", "overlapping", "overlapping"]


# ------------------------------------------------ the checker's own inputs (issue 37)
def test_the_checker_names_what_it_cannot_check(tmp_path, monkeypatch, capsys):
    """A missing path, a folder without a report, a file that is not HTML: one line, exit 2; a
    page without figures is never "ok"; a relative path is read from the working directory."""
    from phaseinterp.report.check import problems, report_page

    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a page")
    for args, said in ((["check-report", "nope"], "does not exist"), (["check-report", "empty"], "is an empty folder"),
                       (["check-report", "notes.txt"], "not an HTML page"),
                       (["screenshot", "empty", "x.png"], "index.html")):
        monkeypatch.chdir(tmp_path)
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "index.html").write_text("<!doctype html><html><body><p>hello</p></body></html>")
    assert report_page("r") == (tmp_path / "r" / "index.html").resolve()
    assert problems({"width": 1400, "scroll_width": 1400, "figures": [], "overflow": [], "bad_text": []}) == [
        "the page has no figures: nothing to check (is it a phaseinterp report?)"]


def test_report_figures_fit_the_page(report):
    """No figure is wider than the page's column (the default report's unit-cycling figure was
    1,400 px on a 1,150 px page): every layout width in the page is at most FIGURE_WIDTH."""
    import plotly.graph_objects as go

    from phaseinterp.report.page import FIGURE_WIDTH, PAGE_WIDTH, tidy_figure

    assert FIGURE_WIDTH < PAGE_WIDTH
    widths = [float(w) for w in re.findall(r'"width":\s*([0-9.]+)', (report / "index.html").read_text())]
    assert widths and max(widths) <= FIGURE_WIDTH
    wide = go.Figure(go.Scatter(x=[0, 1], y=[0, 1]))
    wide.update_layout(width=1400)
    tidy_figure(wide)
    assert wide.layout.width == FIGURE_WIDTH


@pytest.mark.slow  # the default demo: 805 s on two busy cores (HISTORY.md: 340-409 s on two quieter ones)
@pytest.mark.zoo("w4s4", "full", "w4s4-1kv-shared", "dsv4-tiny", "w4s4-staggered")
def test_the_default_demo_report_passes_its_own_check(tmp_path):
    """The main job's own output (`phaseinterp demo`, not --quick) passes `phaseinterp.report.check`."""
    from phaseinterp.report.check import check_page, problems

    _chromium_or_skip()  # before the long build
    assert main(["demo", "--no-static", "--out", str(tmp_path / "demo")]) == 0
    assert problems(check_page(tmp_path / "demo", width=1400)) == []
