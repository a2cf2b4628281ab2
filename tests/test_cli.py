"""The command line: every subcommand on a tiny checkpoint, and clear errors for bad arguments."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from phaseinterp import CompressedConfig, CompressedTransformer
from phaseinterp.cli import main
from phaseinterp.tasks import KeyValueRetrieval

TASK = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model"
    cfg = CompressedConfig(d_vocab=TASK.vocab.size, n_ctx=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                           d_head=16, d_mlp=64, window=4, stride=4, local_window=8)
    model = CompressedTransformer(cfg)
    model.metadata.update(task=TASK.to_dict(), task_type="KeyValueRetrieval")
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("command", ["demo", "report", "profile", "ablate", "cycle", "gates", "train", "zoo",
                                     "merge", "conformance", "check-report", "screenshot", "memory-plan", "experiments"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: phaseinterp" in capsys.readouterr().out


def test_profile_ablate_cycle_gates_write_results(checkpoint, tmp_path, capsys):
    assert main(["profile", str(checkpoint), "--n-per-residue", "40", "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p").exists()
    assert main(["ablate", str(checkpoint), "--layer", "1", "--n-per-residue", "40", "--n-calibration", "8",
                 "--out", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / "arrays.npz").is_file()
    assert main(["cycle", str(checkpoint), "--shifts", "1", "-1", "--n-per-residue", "40",
                 "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "meta.json").is_file()
    # --baseline: the unshifted row from the profile above (same model, same prompts): the same result
    # without --n-per-residue, cycle takes the baseline's size (40 per residue here, as the profile)
    assert main(["cycle", str(checkpoint), "--shifts", "1", "-1", "--baseline",
                 str(tmp_path / "p"), "--out", str(tmp_path / "cb")]) == 0
    from phaseinterp import CyclingResult

    assert (CyclingResult.load(tmp_path / "cb").correct == CyclingResult.load(tmp_path / "c").correct).all()
    early = capsys.readouterr().out
    assert main(["cycle", str(checkpoint), "--shifts", "1", "--n-per-residue", "72", "--baseline",
                 str(tmp_path / "p")]) == 2  # other prompts: refused in one line
    assert "baseline profiles 320 prompts but gate cycling runs 576" in capsys.readouterr().err
    assert main(["gates", str(checkpoint), "--n-per-residue", "40", "--out", str(tmp_path / "g")]) == 0
    assert (tmp_path / "g" / "arrays.npz").is_file() and (tmp_path / "p" / "meta.json").is_file()
    out = early + capsys.readouterr().out
    assert "period_p_value" in out and "homogeneity_p_value" in out  # profile summary table
    assert "kv_head" in out and "shift" in out  # ablation table, cycling table
    assert "window_concentration" in out  # gate statistics
    from phaseinterp import AblationResult, CyclingResult, GateProfile, PhaseProfile

    for cls, name in ((PhaseProfile, "p"), (AblationResult, "a"), (CyclingResult, "c"), (GateProfile, "g")):
        loaded = cls.load(tmp_path / name)
        assert loaded == cls.load(tmp_path / name)  # == on two loaded copies


def test_report_writes_folder(checkpoint, tmp_path, capsys):
    assert main(["report", str(checkpoint), "--out", str(tmp_path / "r"), "--quick", "--no-static"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["profiles"][0]["n_per_residue"] >= 40
    assert "ablation" in summary and "cycling" in summary and "gates" in summary
    html = (tmp_path / "r" / "index.html").read_text()
    for fig in ("fig-phase_profile", "fig-ablation_heatmap", "fig-gate_cycling", "fig-gate_profile"):
        assert fig in html
    assert "report written to" in capsys.readouterr().out
    assert "PNG figures were not written: PNG export turned off" in html  # says when and why PNGs are missing
    assert html.count("<table") >= 4 and "<pre>" not in html  # summaries as tables, no raw JSON dump
    first, second = TASK.vocab.keys[:2]
    assert f"'{first}', '{second}'" not in html and f'"{first}", "{second}"' not in html  # no vocabulary dump
    json.loads((tmp_path / "r" / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(f"JSON {c}"))


def test_train_subcommand(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "t"), "--steps", "2", "--batch-size", "4", "--n-layers", "1"]) == 0
    assert (tmp_path / "t" / "final" / "model.safetensors").is_file()


def test_zoo_list(capsys):
    import phaseinterp as pi

    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert "w4s4" in out and "phaseinterp zoo build w4s4" in out
    for name in pi.zoo.ENTRIES:
        line = next(row for row in out.splitlines() if row.split()[:1] == [name])
        assert ("recipe only" in line) == (name not in pi.zoo.available()), line


def test_readme_zoo_table_is_the_generated_one(capsys):
    """README's zoo table is `phaseinterp zoo list --markdown`, so the two cannot drift apart."""
    from pathlib import Path

    from phaseinterp.cli.commands import zoo_markdown

    assert main(["zoo", "list", "--markdown"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == zoo_markdown()
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert printed in readme, "regenerate README's zoo table with `phaseinterp zoo list --markdown`"


def test_every_option_has_help():
    import argparse

    from phaseinterp.cli.args import build_parser

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, path + [name])
            elif not isinstance(action, argparse._HelpAction):
                yield path, action

    missing = [(" ".join(p), a.dest) for p, a in walk(build_parser(), []) if not a.help]
    assert not missing


@pytest.mark.slow  # spawns a process
def test_help_does_not_import_torch_or_plotly():
    code = ("import sys; from phaseinterp.cli import main\n"
            "try:\n    main(['ablate', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'plotly' not in sys.modules, sorted(sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("argv, message", [
    (["profile", "no-such-model"], "neither a shipped zoo model"),
    (["ablate", "{ckpt}", "--layer", "7"], "layer=7 is out of range for a 2-layer model (0..1)"),
    (["profile", "{ckpt}", "--n-per-residue", "0"], "0 must be >= 1"),
    (["cycle", "{ckpt}", "--branch", "q"], "invalid choice: 'q'"),
    (["cycle", "{ckpt}", "--baseline", "no-such-profile"], "--baseline='no-such-profile' does not exist; expected a profile folder"),
    (["cycle", "{ckpt}", "--score", "unit", "--layer", "1", "--baseline", "p"], "--baseline applies to --score profile only"),
    (["zoo", "build", "nonexistent"], "unknown zoo model 'nonexistent'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_arguments_exit_2_with_one_line(argv, message, checkpoint, capsys):
    argv = [a.replace("{ckpt}", str(checkpoint)) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.slow  # spawns a process
def test_console_script_entry_point():
    out = subprocess.run([sys.executable, "-m", "phaseinterp.cli", "zoo", "frob"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("phaseinterp: error:")


@pytest.mark.slow  # spawns Chromium
def test_report_renders_in_headless_chromium(checkpoint, tmp_path):
    """The report opens in a real browser: a full-page screenshot with the figures drawn."""
    import shutil

    from phaseinterp.report import ReportSettings, build_report

    rep = build_report(str(checkpoint), tmp_path / "r", settings=ReportSettings.quick(), progress=False,
                       log=lambda *_: None)
    for name, fig in rep.figures.items():
        assert fig.data, f"figure {name} has no traces"
        assert any(getattr(t, "y", None) is not None and len(t.y) or getattr(t, "z", None) is not None
                   for t in fig.data), f"figure {name} has no data"
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        import os

        if os.environ.get("CI"):
            pytest.fail("CI must provide chromium")
        pytest.skip("chromium not installed")
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--no-first-run", "--hide-scrollbars",
                    f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=8000",
                    "--window-size=1200,2600", f"--screenshot={shot}", (tmp_path / "r" / "index.html").as_uri()],
                   capture_output=True, timeout=120)
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.std() > 10, "the screenshot is blank"
    # Plotly draws its SVG plot areas: many non-white pixels well below the header.
    assert (pixels[600:] < 200).mean() > 0.01


@pytest.mark.slow  # runs the demo
@pytest.mark.zoo("w4s4", "full")
def test_demo_quick_on_the_shipped_models(tmp_path, capsys):
    import phaseinterp as pi

    assert main(["demo", "--quick", "--no-static", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "| w4s4 (W4/S4 gated) |" in out and "| full (full attention) |" in out
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    labels = [p["label"] for p in summary["profiles"]]
    assert labels[:2] == ["w4s4 (W4/S4 gated)", "full (full attention)"]  # then any training controls
    assert all(label.endswith(")") for label in labels[2:]), labels
    assert len(list((tmp_path / "demo" / "data").glob("*.csv"))) >= 10
    # at the reduced size the compressed models' phase gaps are resolved (regression snapshot of the shipped
    # models); the twin's intervals overlap (it is flat)
    verdicts = {r["model"]: r["verdict"] for r in summary["resolution"]}
    assert verdicts["w4s4 (W4/S4 gated)"] == "separated" and verdicts["full (full attention)"] == "overlapping"
    assert all(v == "separated" for m, v in verdicts.items() if m.startswith(("w4s4-equal", "dsv4-tiny"))), verdicts
    # data/ file names are derived once from each model's zoo name (not also from its label)
    from phaseinterp.report.models import slug as _slug

    zoo_names = {_slug(n) for n in [*pi.zoo.ENTRIES, *pi.zoo.deepseek_v4.available()]}
    stems = {re.sub(r"^profile_(.*)_(residues|phases|prompts)\.csv$", r"\1", p.name)
             for p in (tmp_path / "demo" / "data").glob("profile_*.csv")}
    assert stems and stems <= zoo_names, sorted(stems - zoo_names)
    # gate cycling at the grain of one unit: the rule's pick is named, with the rule (issue 20)
    unit = summary["unit_cycling"]
    assert unit["rule"].startswith("specialized: knockout hurts 1..3 adjacent phases")  # not every phase
    assert unit["units"] and unit["units"][0]["role"] == "specialized" and unit["units"][0]["unit"].startswith("L")
    assert "Gate cycling, one unit at a time" in (tmp_path / "demo" / "index.html").read_text()
    if "dsv4-tiny" in pi.zoo.deepseek_v4.available():  # the DeepSeek-V4 section: HF architecture, same task
        assert "dsv4-tiny (HF DeepSeek-V4)" in labels
        assert summary["deepseek_v4"]["wrapper_max_abs_logit_diff"] <= 1e-4
        assert "phase through the Lightning Indexer" in (tmp_path / "demo" / "index.html").read_text()
    if "w4s4-staggered" in pi.zoo.available():  # the remedy section: staggered windows beside the shared grid
        rows = {r["role"]: r for r in summary["remedy"]["rows"]}
        assert rows["baseline"]["model"] == "w4s4" and rows["staggered"]["model"] == "w4s4-staggered"
        assert rows["staggered"]["stored_bytes_per_token"] == rows["baseline"]["stored_bytes_per_token"]
        assert rows["staggered"]["boundary_phases"] == [1, 3] and rows["baseline"]["boundary_phases"] == [3]
        assert "remedy: w4s4-staggered" in out
        assert (tmp_path / "demo" / "data" / "remedy_heads.csv").is_file()


@pytest.mark.slow  # a 1,728-prompt profile of a shipped checkpoint; the fast tier holds its parts (below)
@pytest.mark.zoo("dsv4-tiny")
def test_cli_accepts_the_hf_deepseek_v4_zoo_names(tmp_path, capsys):
    """`phaseinterp profile dsv4-tiny` loads the HF-format zoo model like any other zoo name. Fast: the name
    through the experiments' one loader (`gates dsv4-tiny`, the next test), `profile` on the family (a
    release folder of it, tests/test_load.py); dsv4-tiny's period 4: tests/test_deepseek_v4.py (slow)."""
    from phaseinterp.profile import PhaseProfile

    pytest.importorskip("transformers")
    assert main(["profile", "dsv4-tiny", "--n-per-residue", "72", "--out", str(tmp_path / "p")]) == 0
    profile = PhaseProfile.load(tmp_path / "p")
    assert profile.stride == 4 and profile.period == 4


@pytest.mark.zoo("dsv4-tiny")
def test_the_cli_takes_a_deepseek_v4_zoo_model(tmp_path, capsys, monkeypatch):
    """One zoo, both families: `zoo list` names `dsv4-tiny` as shipped, `gates` runs on it, and
    `demo --model dsv4-tiny` / `report dsv4-tiny` reach `build_report` with it (the report itself:
    test_report_page; profile: test_load's release folder, and the slow test above; ablate and cycle: the
    slow test below)."""
    from types import SimpleNamespace

    from phaseinterp import report as report_module
    from phaseinterp.interventions import GateProfile

    pytest.importorskip("transformers")
    assert main(["zoo", "list"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.split()[:1] == ["dsv4-tiny"])
    assert "shipped" in line and "recipe only" not in line
    assert main(["gates", "dsv4-tiny", "--n-per-residue", "2", "--out", str(tmp_path / "g")]) == 0
    assert set(GateProfile.load(tmp_path / "g").heads.layer) == {0, 1, 2}
    calls = []
    monkeypatch.setattr(report_module, "build_report",
                        lambda model, out, **kw: calls.append((model, kw["twin"])) or SimpleNamespace(
                            table=lambda: "", seconds=0.0, summary={}))
    assert main(["demo", "--model", "dsv4-tiny", "--twin", "none", "--out", str(tmp_path / "d")]) == 0
    assert main(["report", "dsv4-tiny", "--out", str(tmp_path / "r")]) == 0
    assert calls == [("dsv4-tiny", None), ("dsv4-tiny", None)]


@pytest.mark.slow
@pytest.mark.zoo("dsv4-tiny")
def test_ablate_and_cycle_run_a_deepseek_v4_zoo_model(tmp_path):
    """ablate (the fast path) and cycle on `dsv4-tiny` through the CLI (about 2 CPU-minutes)."""
    from phaseinterp.interventions import AblationResult, CyclingResult

    pytest.importorskip("transformers")
    assert main(["ablate", "dsv4-tiny", "--n-per-residue", "72", "--n-calibration", "24",
                 "--out", str(tmp_path / "a")]) == 0
    ablation = AblationResult.load(tmp_path / "a")
    assert list(ablation.units.layer) == [0, 1, 2] and ablation.stride == 4
    assert main(["cycle", "dsv4-tiny", "--shifts", "1", "--layer", "0", "--n-per-residue", "72",
                 "--out", str(tmp_path / "c")]) == 0
    assert tuple(CyclingResult.load(tmp_path / "c").shifts) == (0, 1)



def test_every_command_has_its_function():
    """Each parsed command runs through one function of the dispatch table (issue 35)."""
    import argparse

    from phaseinterp.cli import commands
    from phaseinterp.cli.args import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(commands.COMMANDS)
    nested = {name: next(a for a in sub.choices[name]._actions if isinstance(a, argparse._SubParsersAction))
              for name in ("zoo", "experiments")}
    assert set(nested["zoo"].choices) == set(commands.ZOO_COMMANDS)
    assert set(nested["experiments"].choices) == set(commands.EXPERIMENTS)


def test_zoo_build_steps_is_for_the_hf_recipes(capsys):
    assert main(["zoo", "build", "w4s4", "--steps", "3", "--out-dir", "/nonexistent-parent/x"]) == 2
    assert "--steps shortens an HF DeepSeek-V4 recipe" in capsys.readouterr().err


def test_version(capsys):
    import phaseinterp

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"phaseinterp {phaseinterp.__version__}"
