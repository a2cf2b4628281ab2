"""The report's "beside the paper" section: the published runs of the model's geometry (or the nearest,
said so), each beside the report's own profile in `phaseinterp.paper.compare`'s statistic, without a
second forward."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import phaseinterp as pi
from phaseinterp.errors import UserInputError
from phaseinterp.profile import profile_from_records
from phaseinterp.report.sections.paper import beside_paper


def _cfg(window, stride, kv, compressed=True):
    return SimpleNamespace(window=window, stride=stride, n_kv_heads=kv, is_compressed=compressed)


# ------------------------------------------------------------------ which runs (published numbers only: fast)
def test_counterparts_rank_the_published_runs_by_geometry():
    c = pi.paper.counterparts(_cfg(4, 4, 2))
    assert set(c.kind) == {"controlled"} and len(c) == 23 and not c.same_geometry.any()
    assert c.iloc[0].id == "kvc_w4s4_1kv" and c.iloc[0]["rank"] == 0 and (c["rank"] > 0).sum() == 22
    same = pi.paper.counterparts(_cfg(8, 8, 1))
    assert set(same[same.same_geometry].id) == {r for r in pi.paper.runs().id if r.startswith("kvc_w8s8_1kv")}
    assert set(same[same.same_geometry & same.plain].id) == {
        "kvc_w8s8_1kv_baseline", "kvc_w8s8_1kv_baseline_seed43", "kvc_w8s8_1kv_baseline_seed44",
        "kvc_w8s8_1kv_baseline_seed45"}
    full = pi.paper.counterparts(_cfg(4, 4, 4, compressed=False))
    assert list(full.id) == ["full_attn_4kv", "full_attn_8kv", "full_attn_1kv"]  # KV heads by ratio: 8 nearer than 1
    assert full.same_geometry.tolist() == [True, False, False] and full["rank"].tolist() == [0, 1, 2]
    assert (full.common_fold == 8).all()  # stride 4 beside the baselines' S = 8: 8 phases
    # the fold is the one compare uses: none for a stride-5 profile on 20 residues
    assert pi.paper.counterparts(_cfg(5, 5, 1), residues=20).common_fold.isna().all()
    with pytest.raises(UserInputError, match="valid: a model config"):
        pi.paper.counterparts(SimpleNamespace(stride=4))


def test_a_model_of_a_published_geometry_is_set_beside_its_runs():
    """A published profile stands in for a measured one (the section reads only the profile and the config)."""
    mine = pi.paper.profile("kvc_w8s8_1kv_baseline_seed45")
    result = beside_paper(mine, _cfg(8, 8, 1), "mine")
    assert result["match"] == "same geometry" and len(result["runs"]) == 13
    assert result["drawn"] == ["kvc_w8s8_1kv_baseline", "kvc_w8s8_1kv_baseline_seed43",
                               "kvc_w8s8_1kv_baseline_seed44", "kvc_w8s8_1kv_baseline_seed45"]
    assert "The paper published 13 runs with this model's geometry (W8/S8, 1 KV head)" in result["statement"]
    assert "the table also lists the 9 variant runs" in result["statement"]
    table = result["table"]
    assert len(table) == 14 and table.variant.iloc[0] == "this model"  # the model once (one fold), then each run
    assert len(result["figure"].data) == 2 * 5  # by residue and by phase, the model and the four plain runs


def test_without_its_geometry_the_section_names_the_nearest_runs():
    mine = pi.paper.profile("kvc_w4s4_1kv")
    same = beside_paper(mine, _cfg(4, 4, 4, compressed=False), "mine")
    assert same["match"] == "same geometry" and list(same["runs"].id) == ["full_attn_4kv"]
    full2 = beside_paper(mine, _cfg(4, 4, 2, compressed=False), "mine")
    assert full2["match"] == "nearest" and full2["nearest"] == ["full_attn_1kv", "full_attn_4kv"]
    assert full2["statement"].startswith("No published run has this model's geometry (full attention, 2 KV heads). "
                                         "The nearest: full_attn_1kv (full attention, 1 KV head); full_attn_4kv")
    assert "(not the same geometry)" in full2["figure"].layout.title.text


def test_a_profile_with_no_common_fold_is_shown_on_its_own_phases_and_said_so():
    rng = np.random.default_rng(0)
    residues = np.repeat(np.arange(20), 30)
    records = pd.DataFrame(dict(residue=residues, correct=rng.random(len(residues)) < 0.5 + 0.4 * (residues % 5 < 4)))
    mine = profile_from_records(records, 20, 5, label="stride five", n_permutations=99)
    result = beside_paper(mine, _cfg(5, 5, 1), "stride five")
    assert result["match"] == "no common fold" and result["comparisons"] == []
    assert "No published run has this model's geometry (W5/S5, 1 KV head)" in result["statement"]
    assert "No published run shares a fold with this profile (20 residues, stride 5" in result["statement"]
    assert set(result["nearest"]) == set(result["runs"].id) and len(result["runs"]) >= 1
    table = result["table"]
    assert len(table) == 1 + len(result["runs"]) and table.compared_on.str.startswith("own: ").all()
    assert table.iloc[0].mean_pct == pytest.approx(100 * mine.mean)
    assert len(result["figure"].data) == 2 * len(table)  # never an empty section


# ------------------------------------------------------------------ in the report, on a shipped model
@pytest.mark.zoo("w4s4")
def test_the_section_on_w4s4_reuses_the_reports_profile(tmp_path):
    """w4s4 is W4/S4 with 2 KV heads: the paper's W4/S4 run has 1, so the section names it as the nearest and
    sets the report's own profile (no second forward) beside it in compare's statistic."""
    from phaseinterp.report import ReportSettings
    from phaseinterp.report.page import MEANINGS, page_html
    from phaseinterp.report.section import ReportContext, SectionClock, run_sections
    from phaseinterp.report.sections.paper import BesideThePaper
    from phaseinterp.report.sections.profile import PhaseProfiles

    model = pi.zoo.load("w4s4")
    out = tmp_path / "r"
    (out / "data").mkdir(parents=True)
    ctx = ReportContext(model=model, task=pi.zoo.task_for(model), settings=ReportSettings(export_static=False),
                        out=out, progress=False, log=lambda *_: None)
    clock = SectionClock()
    run_sections([PhaseProfiles()], ctx, clock)
    profile = ctx.results["phase profiles"][0]

    def no_forward(*_):
        raise AssertionError("the section ran the model again")

    handle = model.register_forward_pre_hook(no_forward)
    try:
        run_sections([BesideThePaper()], ctx, clock)
    finally:
        handle.remove()
    result = ctx.results["beside the paper"]
    assert result["match"] == "nearest" and list(result["runs"].id) == ["kvc_w4s4_1kv"]
    assert "No published run has this model's geometry (W4/S4, 2 KV heads). The nearest: kvc_w4s4_1kv " \
           "(W4/S4, 1 KV head)" in result["statement"]
    # the numbers are compare's on the report's own profile
    expected = pi.paper.compare(profile, "kvc_w4s4_1kv").to_frame()
    shown = result["table"][expected.columns]
    pd.testing.assert_frame_equal(shown.reset_index(drop=True), expected, check_dtype=False)
    assert result["comparisons"][0].profiles[0].label == profile.label
    # the files, the summary and the page
    written = pd.read_csv(out / "data" / "paper_comparison.csv")
    assert np.allclose(written.mean_pct, expected.mean_pct) and list(written.paper_run.fillna("")) == [
        "", "kvc_w4s4_1kv"]
    considered = pd.read_csv(out / "data" / "paper_runs.csv")
    assert len(considered) == 23 and considered.picked.sum() == 1 and considered.id.iloc[0] == "kvc_w4s4_1kv"
    assert len(pd.read_csv(out / "data" / "paper_comparison_phases.csv")) == 2 * 4
    summary = json.loads(pi.results.dumps(ctx.summary["paper"]))
    assert summary["match"] == "nearest" and summary["runs"] == ["kvc_w4s4_1kv"]
    assert summary["comparisons"][0]["mean_pct"][0] == pytest.approx(100 * profile.mean)
    page = page_html({"model": "w4s4", **ctx.summary}, ctx.figures, ctx.tables, {})
    part = page[page.index("<h2>Beside the paper"):]
    part = part[:part.index("What the numbers mean")]
    assert "fig-paper" in part and "kvc_w4s4_1kv: W4/S4 · 1 KV (paper, prefix)" in part
    headers = {re.sub(r"<.*?>", "", h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", part, flags=re.S)}
    assert headers - {"model"} <= set(MEANINGS), headers - set(MEANINGS)
