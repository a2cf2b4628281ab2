"""phaseinterp.paper: the paper's published numbers (figdata.json) inside the toolkit.

Each check compares the toolkit's objects and statistics with the published values written in the
shipped tables (or in figdata.json itself, when the shared copy is beside the repository)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import phaseinterp as pi
from phaseinterp.errors import UserInputError
from phaseinterp.paper import published

FIGDATA = Path(__file__).resolve().parents[2] / "shared" / "paper" / "figdata.json"


@pytest.fixture(scope="module")
def figdata():
    if not FIGDATA.is_file():
        pytest.skip(f"{FIGDATA} is not beside the repository")
    return json.loads(FIGDATA.read_text(encoding="utf-8"))


# ------------------------------------------------------------------ the data and its source
def test_the_shipped_tables_are_the_ones_their_source_json_names():
    src = pi.paper.source()
    assert src["commit"] == "8b6a7a541e2ada09139f96374632e40311ea6507"
    assert src["figdata_sha256"] == "320b05a74e7d34c262d77a3c3c144be83a420a276277da663d4feb5251e549e3"
    for name, info in src["tables"].items():
        blob = (published.DATA / name).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == info["sha256"], name


def test_the_build_reproduces_the_shipped_tables_from_figdata(figdata, tmp_path):
    from phaseinterp.paper.build import build

    built = build(FIGDATA, tmp_path)
    assert built["figdata_sha256"] == hashlib.sha256(FIGDATA.read_bytes()).hexdigest()
    for name in built["tables"]:
        assert (tmp_path / name).read_bytes() == (published.DATA / name).read_bytes(), name


def test_runs_has_one_row_per_published_run_baseline_and_deepseek_model():
    runs = pi.paper.runs()
    assert len(runs) == 31 and runs.id.is_unique
    assert runs.kind.value_counts().to_dict() == {"controlled": 23, "full attention": 3, "DeepSeek": 5}
    row = runs.set_index("id").loc["kvc_w8s8_1kv_baseline"]
    assert (row.W, row.S, row.kv_heads, row.layers, row.loss) == (8, 8, 1, 28, 2.478)
    assert (row.mean_pct, row.mean_pct_lower, row.mean_pct_upper) == (50.56, 48.65, 52.5)
    assert (row.gap_pp, row.gap_pp_lower, row.gap_pp_upper) == (75.3, 72.6, 77.9)
    # docs/science.md's published gaps: W8/S8 1 KV over 4 seeds; full attention 1, 4, 8 KV heads
    seeds = runs[runs.id.str.startswith("kvc_w8s8_1kv_baseline")].gap_pp.tolist()
    assert seeds == [75.3, 59.2, 70.3, 36.6]
    assert runs[runs.kind == "full attention"].gap_pp.tolist() == [3.1, 6.1, 4.3]
    assert runs.set_index("id").loc["flash_base", "gap_pp"] == 40.23


# ------------------------------------------------------------------ profiles
def test_profile_returns_the_published_accuracies_exactly(figdata):
    for m in figdata["runs"]["models"]:
        for key, padding in (("pp", "prefix"), ("ip", "in-sequence")):
            p = pi.paper.profile(m["id"], padding, n_permutations=1)
            assert p.published and p.modulus == 24 and p.stride == m["S"]
            assert np.round(100 * p.residue_accuracy, 2).tolist() == m[key]["acc"]
            assert np.round(100 * p.residue_lower, 2).tolist() == m[key]["lo"]
            assert np.round(100 * p.residue_upper, 2).tolist() == m[key]["hi"]
            assert np.max(np.abs(100 * p.residue_accuracy - m[key]["acc"])) < 1e-9
            assert len(p.records) == 0 and p.residue_n.sum() == 0
    for t in figdata["acc"]["full"]:
        p = pi.paper.profile(t["id"], n_permutations=1)
        assert np.round(100 * p.residue_accuracy, 2).tolist() == t["acc"]
        assert round(100 * p.mean, 2) == t["mean"] and abs(100 * p.gap - t["gap"]) < 0.051


def test_deepseek_profiles_have_wilson_intervals_from_their_counts(figdata):
    assert len(figdata["niah"]["models"]) == 5
    for m in figdata["niah"]["models"]:
        p = pi.paper.profile(m["name"])  # by name, as the paper writes it
        assert p.modulus == 8 and p.stride == m["S"] and p.residue_n.tolist() == [m["n"]] * 8
        assert p.residue_correct.tolist() == m["correct"]
        assert np.round(100 * p.residue_accuracy, 2).tolist() == m["acc"]
        assert np.max(np.abs(100 * p.residue_lower - m["lo"])) <= 0.01
        assert np.max(np.abs(100 * p.residue_upper - m["hi"])) <= 0.01
        assert abs(100 * p.mean - m["mean"]) <= 0.005 and abs(100 * p.gap - m["gap"]) <= 0.011
        assert p.interval_method == "wilson" and 0 <= p.homogeneity_p_value <= 1


def test_a_published_profile_is_a_phase_profile_every_tool_accepts(tmp_path):
    p = pi.paper.profile("kvc_w8s8_1kv_baseline")
    assert isinstance(p, pi.PhaseProfile) and p.source.startswith("paper: kvc_w8s8_1kv_baseline, prefix")
    assert p.period == 8 and p.worst_phases == (7,)
    # the cycling section published the clean phase intervals of this run
    assert np.isfinite(p.phase_lower).all() and (p.phase_lower <= p.phase_accuracy + 1e-9).all()
    assert pi.stats.detect_period(p.residue_accuracy, seed=0).period == 8
    assert p.plot().data and pi.plot.profiles_figure([p, pi.paper.profile("full_attn_1kv")]).data
    back = pi.PhaseProfile.load(p.save(tmp_path / "p"))
    assert back == p and back.published
    refolded = pi.paper.profile("kvc_w8s8_1kv_baseline", stride=4)
    assert "re-folded by S=4" in refolded.label and refolded.phase_accuracy.shape == (4,)


@pytest.mark.parametrize("padding", ["prefix", "in-sequence"])
def test_the_published_profiles_read_their_strides_as_the_paper_says(padding):
    """The period test gives each controlled run's stride under both paddings, W8/S4 (overlapping windows,
    a dominant even/odd alternation) included: see docs/science.md."""
    runs = pi.paper.runs().set_index("id")
    periods = {r: pi.paper.profile(r, padding).period for r in runs.index[runs.kind == "controlled"]}
    assert len(periods) == 23 and {k: v for k, v in periods.items() if v != runs.loc[k, "S"]} == {}


# ------------------------------------------------------------------ knockouts and gates
def test_knockout_is_an_ablation_result_whose_fold_is_the_gate_sections(figdata):
    checked = 0
    for g in figdata["gates"]["models"]:
        k = pi.paper.knockout(g["id"], "prefix")
        assert isinstance(k, pi.AblationResult) and k.published
        folded = k.relative_change.to_numpy()
        assert folded.shape == (g["layers"] * g["kv"], g["S"])
        published_fold = np.asarray(g["ko"], float).reshape(g["layers"] * g["kv"], g["S"])
        assert np.max(np.abs(folded - published_fold)) <= 0.1 + 1e-9
        checked += folded.size
    assert checked == 2576


def test_knockout_maps_hold_the_published_residues_and_draw_with_ablates_heatmap(figdata, tmp_path):
    m = next(m for m in figdata["runs"]["models"] if m["id"] == "kvc_w8s8_4kv")
    k = pi.paper.knockout("kvc_w8s8_4kv", "in-sequence")
    assert k.relative_change_residue.to_numpy().tolist() == m["ip"]["ko"]
    assert k.units.heads.iloc[1] == (4, 5, 6, 7)  # KV head 1 of 4 is read by query heads 4..7 of 16
    fig = k.plot()
    assert fig.data[0].type == "heatmap" and "published map" in fig.layout.title.text
    with pytest.raises(UserInputError, match="per-prompt records"):
        k.phase_tests()
    assert AblationLoad(k, tmp_path)
    ds = pi.paper.knockout("DeepSeek-V4-Flash-Base")
    assert ds.scope == "layer" and ds.residue_modulus == 8 and ds.stride == 4 and len(ds.units) == 43
    assert ds.relative_change_residue.to_numpy().tolist() == figdata["ko"]["deepseek"]["rel"]
    assert ds.plot().data


def AblationLoad(k, tmp_path) -> bool:
    back = pi.AblationResult.load(k.save(tmp_path / "k"))
    return back == k and back.published


def test_gates_beside_knockouts(figdata):
    g = pi.paper.gates("kvc_w8s8_1kv_baseline")
    assert g.highlight == (9, 10, 14)
    kg = g.key_gate()
    assert kg.shape == (28, 1, 8) and np.allclose(kg.sum(-1), 8, atol=0.0005 * 8)
    src = next(m for m in figdata["gates"]["models"] if m["id"] == "kvc_w8s8_1kv_baseline")
    assert kg.tolist() == src["kg"]
    assert g.plot().data and len(g.alignment()) == 28


# ------------------------------------------------------------------ cycling
def test_the_toolkits_squared_correlations_are_the_papers_r2_on_all_30_conditions(figdata):
    n = 0
    for run in figdata["cyc"]["runs"]:
        frame = pi.paper.cycling(run["id"]).to_frame().set_index("shift")
        for c in run["conds"]:
            row = frame.loc[c["d"]]
            assert abs(row.corr2 - c["r2x"][0]) <= 2e-3, (run["id"], c["d"], "r2x")
            assert abs(row.corr2_all - c["r2a"][0]) <= 2e-3, (run["id"], c["d"], "r2a")
            assert abs(row.corr2_interior - c["r2i"][0]) <= 2e-3, (run["id"], c["d"], "r2i")
            assert row.paper_r2 == c["r2x"][0]
            n += 1
    assert n == 30


def test_the_papers_headline_range_is_the_excluding_the_last_phase_one():
    """docs/science.md: "R^2 = 0.98 for the headline model, 0.66..1.00 across five models and shifts up to 3"."""
    frames = [pi.paper.cycling(r).to_frame() for r in pi.paper.cycling_runs().id]
    corr2 = pd.concat(frames).corr2
    assert round(corr2.min(), 2) == 0.66 and round(corr2.max(), 2) == 1.00
    headline = pi.paper.cycling("kvc_w12s12_4kv").to_frame().set_index("shift").loc[1]
    assert round(headline.corr2, 2) == 0.98
    assert pd.concat(frames).corr2_all.min() < 0.66  # the all-phase score is not the headline's


def test_cycling_to_frame_has_one_row_per_shift_and_the_toolkits_stricter_scores():
    c = pi.paper.cycling("W12/S12 · 4 KV")
    frame = c.to_frame()
    assert frame["shift"].tolist() == [-3, -2, -1, 1, 2, 3]
    assert {"paper_r2", "corr2", "r2", "r2_all", "mae_pp", "displacement"} <= set(frame.columns)
    assert (frame.r2 <= frame.corr2 + 1e-12).all()  # no fitted line: never above the squared correlation
    assert frame.identified.all()
    assert c.plot().data


# ------------------------------------------------------------------ bad names
@pytest.mark.parametrize("call, valid", [
    (lambda: pi.paper.profile("w8s8"), "kvc_w8s8_1kv_baseline"),
    (lambda: pi.paper.profile("kvc_w8s8_1kv_baseline", "suffix"), "prefix, in-sequence"),
    (lambda: pi.paper.profile("flash_base", "prefix"), "needle"),
    (lambda: pi.paper.knockout("kvc_w8s8_1kv_baseline", "middle"), "prefix, in-sequence"),
    (lambda: pi.paper.knockout("full_attn_4kv"), "kvc_w8s8_1kv_baseline"),
    (lambda: pi.paper.cycling("kvc_w4s4_1kv"), "kvc_w12s12_4kv"),
    (lambda: pi.paper.gates("pro_base"), "kvc_w8s8_1kv_nope"),
    (lambda: pi.paper.profile("kvc_w8s8_1kv_baseline", stride=5), "1, 2, 3, 4, 6, 8, 12, 24"),
])
def test_a_bad_run_or_padding_is_one_line_naming_the_valid_choices(call, valid):
    with pytest.raises(UserInputError) as err:
        call()
    text = str(err.value)
    assert "\n" not in text and "valid: " in text and valid in text


# ------------------------------------------------------------------ compare
@pytest.mark.zoo("w4s4")
def test_compare_puts_a_zoo_profile_beside_a_published_run(zoo_profile):
    mine = zoo_profile("w4s4", 72)
    cmp = pi.paper.compare(mine, "kvc_w4s4_1kv")
    table = cmp.to_frame()
    assert len(table) == 2 and table.source.tolist() == ["measured", "published"]
    assert cmp.fold == 4 and cmp.modulus == 24
    theirs = table.iloc[1]
    assert theirs.gap_pp == pytest.approx(50.5, abs=0.051) and theirs.mean_pct == pytest.approx(38.46, abs=0.05)
    assert (theirs.gap_pp_lower, theirs.gap_pp_upper) == (48.3, 54.0)
    assert table.iloc[0].mean_pct == pytest.approx(100 * mine.mean) and table.iloc[0].gap_pp == pytest.approx(100 * mine.gap)
    fig = cmp.plot()
    assert len(fig.data) >= 4
    # a stride-4 profile beside a stride-8 run: both on 8 phases, the stride-4 one repeated, none mixed
    wide = pi.paper.compare(mine, "kvc_w8s8_1kv_baseline")
    assert wide.fold == 8 and any("each of its phases 2 times" in n for n in wide.notes)
    folded = wide.profiles[0].phase_accuracy
    assert folded.shape == (8,) and np.allclose(pi.stats.fold_residues(folded, 4), mine.phase_accuracy)
    # against a DeepSeek needle profile: 8 common residues
    needle = pi.paper.compare(mine, "DeepSeek-V4-Flash-Base")
    assert needle.modulus == 8 and needle.fold == 4


@pytest.mark.zoo("w6s6")
def test_compare_refuses_a_stride_with_no_common_fold(zoo_profile):
    mine = zoo_profile("w6s6", 72)
    with pytest.raises(UserInputError) as err:
        pi.paper.compare(mine, "DeepSeek-V4-Flash-Base")
    text = str(err.value)
    assert "no common fold" in text and "\n" not in text
    assert "valid: " in text and "kvc_w8s6" in text and "flash_base" not in text.split("valid: ")[1]
    assert pi.paper.compare(mine, "kvc_w8s6").fold == 6


def test_compare_of_published_results_with_each_other():
    """Knockout and cycling comparisons, on published results alone (fast)."""
    k = pi.paper.compare(pi.paper.knockout("kvc_w8s8_1kv_baseline_seed43"), "kvc_w8s8_1kv_baseline")
    assert k.kind == "knockout" and len(k.to_frame()) == 2 and k.plot().data
    assert k.to_frame().specialized_units.iloc[1] >= 3  # layers 9, 10, 14 of the baseline serve 1..3 phases
    # the map behind the counts: per (unit, phase) whether it hurts, per unit whether it is specialized
    baseline = k.detail[k.detail.model == k.to_frame().model.iloc[1]]
    units = baseline[baseline.specialized & baseline.hurt].groupby("layer").phase.apply(list).to_dict()
    assert {9: [5, 6], 10: [3, 4], 14: [1, 2]}.items() <= units.items()
    assert len(units) == k.to_frame().specialized_units.iloc[1]
    assert (baseline.hurt == (baseline.relative_change <= -50)).all()
    c = pi.paper.compare(pi.paper.cycling("kvc_w8s8_1kv_baseline_seed43"), "kvc_w8s8_1kv_baseline")
    table = c.to_frame()
    assert c.kind == "cycling" and table.paper_r2_min.iloc[1] == pytest.approx(
        pi.paper.cycling("kvc_w8s8_1kv_baseline").to_frame().corr2.min())
    assert c.plot().data
    with pytest.raises(UserInputError, match="valid: a PhaseProfile"):
        pi.paper.compare(pi.paper.gates("kvc_w8s4"), "kvc_w8s4")


# ------------------------------------------------------------------ command line
def test_the_command_line_names_a_bad_published_run_before_any_work(capsys):
    from phaseinterp.cli import main

    assert main(["paper", "--list"]) == 0
    assert "kvc_w8s8_1kv_baseline" in capsys.readouterr().out
    assert main(["profile", "w4s4", "--paper", "w8s8-paper"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "run='w8s8-paper' is not a published run" in err and "valid: " in err
    assert main(["profile", "w4s4", "--paper", "flash_base", "--paper-padding", "prefix"]) == 2
    assert "valid: needle" in capsys.readouterr().err  # the DeepSeek needles have one evaluation
    assert main(["ablate", "w4s4", "--paper-figure", "x.html"]) == 2
    assert "--paper-figure applies to --paper only" in capsys.readouterr().err  # the flags' one declaration


@pytest.mark.zoo("w6s6")
def test_a_run_with_no_common_fold_is_refused_before_the_experiment(capsys, monkeypatch):
    """``profile w6s6 --paper flash_base`` (24 residues, stride 6, beside 8 residues, stride 4: no common
    fold) and the same for ``ablate`` are refused after the model loads and before any prompt runs,
    naming the runs that do have a common fold."""
    import phaseinterp.cli.commands as commands
    from phaseinterp.cli import main

    def ran(*args, **kwargs):
        raise AssertionError("the experiment ran before the refusal")

    monkeypatch.setattr(commands, "phase_profile", ran, raising=False)
    monkeypatch.setattr(commands, "ablate", ran, raising=False)
    for command in (["profile", "w6s6"], ["ablate", "w6s6", "--layer", "1"]):
        assert main(command + ["--paper", "flash_base"]) == 2
        err = capsys.readouterr().err
        assert "'w6s6' (R=24, S=6) and flash_base (R=8, S=4) have no common fold" in err and "valid: " in err
        assert "kvc_w8s6" in err.split("valid: ")[1]


@pytest.mark.zoo("w4s4-1kv-shared")
def test_paper_on_profile_ablate_and_cycle_prints_and_draws_what_compare_gives(tmp_path, capsys):
    """``--paper RUN`` end to end on the smallest shipped model (2 layers, 1 KV head: the geometry of the
    paper's W4/S4 run), one unit and one shift: the printed table is `compare` on the saved result, the
    figure file is written, and the numbers are the result's own."""
    from phaseinterp.cli import main

    def printed(comparison) -> str:  # the CLI's table: one column per model, numbers to 2 decimals
        return comparison.to_frame().set_index("model").T.to_string(float_format=lambda v: f"{v:.2f}")

    def drawn(path, comparison) -> None:
        page = path.read_text(encoding="utf-8")
        assert path.stat().st_size > 10_000 and "plotly" in page.lower()
        assert json.dumps(comparison.plot().layout.title.text)[1:-1] in page or comparison.run in page

    model, out = "w4s4-1kv-shared", capsys
    assert main(["profile", model, "--out", str(tmp_path / "p"), "--paper", "kvc_w4s4_1kv",
                 "--paper-figure", str(tmp_path / "p.html")]) == 0
    profile = pi.PhaseProfile.load(tmp_path / "p")
    expected = pi.paper.compare(profile, "kvc_w4s4_1kv")
    text = out.readouterr().out
    assert "beside the paper's kvc_w4s4_1kv (prefix; profile, 24 residues, 4 phases):" in text
    assert printed(expected) in text
    mine = expected.to_frame().iloc[0]
    assert mine.mean_pct == pytest.approx(100 * profile.mean) and mine.gap_pp == pytest.approx(100 * profile.gap)
    drawn(tmp_path / "p.html", expected)

    assert main(["ablate", model, "--layer", "1", "--n-calibration", "24", "--out", str(tmp_path / "a"),
                 "--paper", "kvc_w4s4_1kv", "--paper-padding", "in-sequence",
                 "--paper-figure", str(tmp_path / "a.html")]) == 0
    ablation = pi.AblationResult.load(tmp_path / "a")
    expected = pi.paper.compare(ablation, "kvc_w4s4_1kv", "in-sequence")
    text = out.readouterr().out
    assert "beside the paper's kvc_w4s4_1kv (in-sequence; knockout):" in text and printed(expected) in text
    mine, theirs = expected.to_frame().iloc[0], expected.to_frame().iloc[1]
    # the paper's fold: each phase the mean of its residues' relative changes
    folded = pi.stats.fold_residues(ablation.relative_change_residue.to_numpy(float), 4)
    assert mine.units == 1 and theirs.units == 28 and mine.worst_change_pct == pytest.approx(float(np.nanmin(folded)))
    assert theirs.worst_change_pct == pytest.approx(
        float(np.nanmin(pi.paper.knockout("kvc_w4s4_1kv", "in-sequence").relative_change.to_numpy(float))))
    drawn(tmp_path / "a.html", expected)

    # the paper's headline gate-cycling run has no other published data: --paper takes it all the same
    assert main(["cycle", model, "--shifts", "1", "--baseline", str(tmp_path / "p"), "--out", str(tmp_path / "c"),
                 "--paper", "kvc_w12s12_4kv", "--paper-figure", str(tmp_path / "c.html")]) == 0
    cycling = pi.CyclingResult.load(tmp_path / "c")
    expected = pi.paper.compare(cycling, "kvc_w12s12_4kv")
    text = out.readouterr().out
    assert "beside the paper's kvc_w12s12_4kv (prefix; cycling):" in text and printed(expected) in text
    scores = cycling.scores["per_shift"].set_index("shift").loc[1]
    assert expected.to_frame().iloc[0].paper_r2_min == pytest.approx(scores.corr2)
    assert expected.to_frame().iloc[1].paper_r2_max == pytest.approx(
        pi.paper.cycling("kvc_w12s12_4kv").to_frame().corr2.max())
    drawn(tmp_path / "c.html", expected)


def test_cycle_paper_takes_the_gate_cycling_runs_only(capsys):
    """Checked before any work: a run without published gate cycling names the five that have it, and the
    published gate cycling has prefix padding only."""
    from phaseinterp.cli import main

    assert main(["cycle", "w4s4-1kv-shared", "--shifts", "1", "--paper", "kvc_w4s4_1kv"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "has no published gate cycling; valid: " in err and "kvc_w12s12_4kv" in err
    assert main(["cycle", "w4s4-1kv-shared", "--shifts", "1", "--paper", "kvc_w12s12_4kv", "--paper-padding",
                 "in-sequence"]) == 2
    assert "the published gate cycling is under prefix padding" in capsys.readouterr().err
