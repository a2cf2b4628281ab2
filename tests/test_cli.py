"""The command line: every subcommand on a tiny checkpoint, and clear errors for bad arguments."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("command", ["demo", "report", "profile", "ablate", "cycle", "gates", "train", "zoo"])
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
    assert main(["gates", str(checkpoint), "--n-per-residue", "40", "--out", str(tmp_path / "g")]) == 0
    assert (tmp_path / "g" / "gate_heads.csv").is_file()
    out = capsys.readouterr().out
    assert '"period_p_value"' in out  # profile summary
    assert "kv_head" in out and "shift" in out  # ablation table, cycling table
    assert "window_concentration" in out  # gate statistics


def test_report_writes_folder(checkpoint, tmp_path, capsys):
    assert main(["report", str(checkpoint), "--out", str(tmp_path / "r"), "--quick", "--no-static"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["profiles"][0]["n_per_residue"] >= 40
    assert "ablation" in summary and "cycling" in summary and "gates" in summary
    html = (tmp_path / "r" / "index.html").read_text()
    for fig in ("fig-phase_profile", "fig-ablation_heatmap", "fig-gate_cycling", "fig-gate_profile"):
        assert fig in html
    assert "report written to" in capsys.readouterr().out


def test_train_subcommand(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "t"), "--steps", "2", "--batch-size", "4", "--n-layers", "1"]) == 0
    assert (tmp_path / "t" / "final" / "model.safetensors").is_file()


def test_zoo_list(capsys):
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert "w4s4" in out and "phaseinterp zoo build w4s4" in out


@pytest.mark.parametrize("argv, message", [
    (["profile", "no-such-model"], "neither a zoo name"),
    (["ablate", "{ckpt}", "--layer", "7"], "layer=7 is out of range for a 2-layer model (0..1)"),
    (["profile", "{ckpt}", "--n-per-residue", "0"], "0 must be >= 1"),
    (["cycle", "{ckpt}", "--branch", "q"], "invalid choice: 'q'"),
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


def test_console_script_entry_point():
    out = subprocess.run([sys.executable, "-m", "phaseinterp.cli", "zoo", "frob"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("phaseinterp: error:")


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


def test_demo_quick_on_the_shipped_models(tmp_path, capsys):
    import phaseinterp as pi

    if not {"w4s4", "full"} <= set(pi.zoo.available()):
        pytest.skip("zoo checkpoints not built")
    assert main(["demo", "--quick", "--no-static", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "| w4s4 (W4/S4 gated) |" in out and "| full (full attention) |" in out
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert [p["label"] for p in summary["profiles"]] == ["w4s4 (W4/S4 gated)", "full (full attention)"]
    assert len(list((tmp_path / "demo" / "data").glob("*.csv"))) >= 10
