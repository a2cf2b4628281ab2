"""Notebooks execute end to end (small sizes) and the examples run; figures export to PNG."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import phaseinterp as pi

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
needs_zoo = pytest.mark.skipif(not {"w4s4", "full"} <= set(pi.zoo.available()), reason="zoo checkpoints not built")


@needs_zoo
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PHASEINTERP_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("PHASEINTERP_NO_PROGRESS", "1")
    book = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in book.cells if c.cell_type == "code"), "store notebooks without outputs"
    NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in book.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


@needs_zoo
@pytest.mark.parametrize("script, args", [("stride_sweep.py", ["--n-per-residue", "72"]),
                                          ("ablate_layer.py", ["--layer", "1", "--n-per-residue", "72"])])
def test_example_runs(script, args, tmp_path):
    env = dict(os.environ, PHASEINTERP_NO_PROGRESS="1")
    out = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--out", str(tmp_path), *args],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert list(tmp_path.rglob("*.html"))


def test_png_export(tmp_path):
    """A real PNG through kaleido + Chromium (CI installs both)."""
    import plotly.graph_objects as go

    from phaseinterp.plot import export

    if not export.static_export_available():
        if os.environ.get("CI"):
            pytest.fail("CI must provide kaleido and chromium for static export")
        pytest.skip("kaleido or chromium not installed")
    (path,) = export.save(go.Figure(go.Bar(x=[0, 1, 2], y=[0.9, 0.2, 0.8])), tmp_path / "fig.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_export_errors(tmp_path):
    import plotly.graph_objects as go

    from phaseinterp.plot import export

    with pytest.raises(ValueError, match="not supported"):
        export.save(go.Figure(), tmp_path / "fig.gif")
