"""Notebooks execute end to end (small sizes) and the examples run; figures export to PNG."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import run_child

pytestmark = pytest.mark.slow  # runs notebooks and examples in child processes


ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
needs_zoo = pytest.mark.zoo("w4s4", "full")


@needs_zoo
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path):
    """Executed in a child process (`run_child`): nbclient installs SIGINT/SIGTERM handlers that
    only shut its kernel down, which inside pytest would swallow the run's Ctrl-C."""
    import nbformat

    book = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in book.cells if c.cell_type == "code"), "store notebooks without outputs"
    executed = tmp_path / "executed.ipynb"
    env = dict(os.environ, PHASEINTERP_NOTEBOOK_SMALL="1", PHASEINTERP_NO_PROGRESS="1")
    run = run_child([sys.executable, "-c", _EXECUTE, str(path), str(tmp_path), str(executed)], timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    book = nbformat.read(executed, as_version=4)
    errors = [o for c in book.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


_EXECUTE = """
import sys, nbformat
from nbclient import NotebookClient
book = nbformat.read(sys.argv[1], as_version=4)
try:
    NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": sys.argv[2]}}).execute()
finally:
    nbformat.write(book, sys.argv[3])
"""


SWEEP = ("w4s4", "w6s6", "w8s4-deepseek", "full", "deep12-w8s8-1kv-shared-equal", "dsv4-tiny")


@needs_zoo
@pytest.mark.parametrize("script, args", [
    # one model per kind (two strides, the DeepSeek kernel, full attention, a 12-layer model, HF DeepSeek-V4):
    # the example runs; the zoo's science is tested in test_zoo*.py
    # --quick: smoke size (the scripts' numbers at full size are the zoo tests' claims)
    pytest.param("stride_sweep.py", ["--quick", "--models", *SWEEP], marks=pytest.mark.zoo(*SWEEP)),
    pytest.param("ablate_layer.py", ["--quick", "--layer", "11"],
                 marks=pytest.mark.zoo("deep12-w8s8-1kv-shared-equal"))])
def test_example_runs(script, args, tmp_path):
    env = dict(os.environ, PHASEINTERP_NO_PROGRESS="1")
    out = run_child([sys.executable, str(ROOT / "examples" / script), "--out", str(tmp_path), *args], env=env,
                    timeout=600)
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


def test_a_warm_static_session_writes_the_same_png_and_stops(tmp_path, monkeypatch):
    """`static_session` starts kaleido's browser in the background; `save_static` inside it waits for
    that start and writes byte-identical PNGs; the session ends with no server left; disabled, it
    starts nothing; a failed start leaves `save_static` to start its own browser."""
    import kaleido
    import plotly.graph_objects as go

    from phaseinterp.plot import export

    if not export.static_export_available():
        if os.environ.get("CI"):
            pytest.fail("CI must provide kaleido and chromium for static export")
        pytest.skip("kaleido or chromium not installed")
    fig = go.Figure(go.Bar(x=[0, 1, 2], y=[0.9, 0.2, 0.8]))
    export.save_static({tmp_path / "cold.png": fig})
    with export.static_session():
        assert export._warming is not None
        export.save_static({tmp_path / "warm.png": fig})
    assert export._warming is None
    assert (tmp_path / "warm.png").read_bytes() == (tmp_path / "cold.png").read_bytes()
    with export.static_session(enabled=False):
        assert export._warming is None

    def broken(**kwargs):
        raise RuntimeError("no browser today")

    monkeypatch.setattr(kaleido, "start_sync_server", broken)
    with export.static_session():
        export.save_static({tmp_path / "fallback.png": fig})
    assert (tmp_path / "fallback.png").read_bytes() == (tmp_path / "cold.png").read_bytes()


def test_export_errors(tmp_path):
    import plotly.graph_objects as go

    from phaseinterp.plot import export

    with pytest.raises(ValueError, match="not supported"):
        export.save(go.Figure(), tmp_path / "fig.gif")


# ------------------------------------------------------- Jupyter-facing reprs
def _results_and_tasks():
    """One of each result object (tiny model, R = 8 task) and each task."""
    from phaseinterp import CompressedConfig, CompressedTransformer, ablate, gate_cycling_profile, gate_profile, phase_profile
    from phaseinterp.tasks import DocstringProbe, KeyValueRetrieval, NeedleRetrieval

    task = KeyValueRetrieval(seq_len=64, n_records=8, n_demos=2, min_distance=20, residue_modulus=8)
    cfg = CompressedConfig(d_vocab=task.vocab.size, n_ctx=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                           d_head=16, d_mlp=64, window=4, stride=4, local_window=8)
    model = CompressedTransformer(cfg).eval()
    batch = task.generate(23, seed=0)
    probe = DocstringProbe.synthetic(task.vocab, lengths=(24, 25, 26, 27))
    return {
        "PhaseProfile": phase_profile(model, batch, progress=False, n_permutations=19),
        "AblationResult": ablate(model, task, prompts=batch, n_calibration=8, progress=False),
        "CyclingResult": gate_cycling_profile(model, task, shifts=(1, -1), prompts=batch, progress=False, n_boot=10),
        "GateProfile": gate_profile(model, task, prompts=batch),
        "DocstringResult": probe.run(model, task.vocab),
        "KeyValueRetrieval": task,
        "NeedleRetrieval": NeedleRetrieval(),
        "DocstringProbe": probe,
    }, task


def test_reprs_are_short_tables_and_html_has_a_table():
    import pandas as pd

    objects, task = _results_and_tasks()
    for name, obj in objects.items():
        text = repr(obj)
        assert text.startswith(f"<{name}"), text[:80]
        assert len(text.splitlines()) <= 20 and len(text) <= 1500, f"{name} repr is long:\n{text}"
        assert "array(" not in text and "[[" not in text and "\n0 " not in text, f"{name} dumps data:\n{text}"
        assert task.vocab.keys[20] not in text and task.vocab.values[20] not in text, f"{name} dumps the vocabulary"
        page = obj._repr_html_()
        assert "<table" in page and "</table>" in page, name
        if hasattr(obj, "plot"):  # result objects: the table plus the figure
            assert "plotly" in page, f"{name} _repr_html_ has no figure"
            assert isinstance(obj.summary(), pd.DataFrame) and isinstance(obj.to_dict(), dict)
            assert len(obj.summary()) == len(obj.to_dict())


def test_result_objects_round_trip_in_one_format(tmp_path):
    objects, _ = _results_and_tasks()
    for name, obj in objects.items():
        if not hasattr(obj, "save"):
            continue
        path = obj.save(tmp_path / name)
        assert sorted(p.name for p in path.iterdir()) == ["arrays.npz", "meta.json"], name
        again = type(obj).load(path)
        assert again == obj and again == type(obj).load(path), name
        assert repr(again) == repr(obj), name


def test_science_references_point_into_the_repository():
    """The project states its science in docs/science.md; no file cites a SCIENCE.md outside the repo."""
    assert (ROOT / "docs" / "science.md").is_file()
    stale = []
    for folder in ("phaseinterp", "tests", "docs", "notebooks", "examples", "benchmarks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".ipynb") and path != Path(__file__).resolve() \
                    and "SCIENCE.md" in path.read_text(errors="ignore"):
                stale.append(str(path.relative_to(ROOT)))
    if "SCIENCE.md" in (ROOT / "README.md").read_text():
        stale.append("README.md")
    assert not stale, f"point these at docs/science.md: {stale}"


def test_repr_html_ships_plotly_js_inline_once(monkeypatch):
    """Offline Jupyter: the first figure carries plotly.js itself (no CDN), later ones reuse it."""
    from phaseinterp import results

    objects, _ = _results_and_tasks()
    obj = next(o for o in objects.values() if hasattr(o, "plot"))
    monkeypatch.setattr(results, "_PLOTLY_JS_SENT", False)
    first, second = obj._repr_html_(), obj._repr_html_()
    cdn = 'src="https://cdn.plot.ly'
    assert cdn not in first and len(first) > 1_000_000, "plotly.js inline in the first figure"
    assert cdn not in second and len(second) < 200_000, "not again in the next"
    monkeypatch.setenv("PHASEINTERP_PLOTLYJS", "cdn")
    assert cdn in obj._repr_html_()
    monkeypatch.setenv("PHASEINTERP_PLOTLYJS", "nosuch")
    assert "PHASEINTERP_PLOTLYJS=&#x27;nosuch&#x27;" in obj._repr_html_()  # the table renders; the error says why
