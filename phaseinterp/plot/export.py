"""Writing figures: interactive HTML always, PNG/SVG/PDF offline through kaleido + a local Chromium."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable, Union

import plotly.graph_objects as go

STATIC_FORMATS = ("png", "svg", "pdf")
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class ExportError(RuntimeError):
    """A static image could not be written (no kaleido or no browser)."""


def find_browser() -> str | None:
    """A local Chromium/Chrome for kaleido: ``$BROWSER_PATH``, else the first one on PATH."""
    path = os.environ.get("BROWSER_PATH")
    if path and Path(path).is_file():
        return path
    for name in _BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def static_export_available() -> bool:
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False
    return find_browser() is not None


def save(fig: go.Figure, path: Union[str, Path], formats: Iterable[str] | None = None, scale: float = 2.0) -> list[Path]:
    """Write ``fig`` to ``path``; the suffix picks the format (``.html``, ``.png``, ``.svg``,
    ``.pdf``). With ``formats`` the stem of ``path`` is written once per format.
    Returns the written paths. Static formats need ``pip install phaseinterp[export]``
    and a Chromium (Debian: ``apt-get install chromium``); without them an
    `ExportError` says so.
    """
    path = Path(path)
    kinds = list(formats) if formats is not None else [path.suffix.lstrip(".").lower() or "html"]
    bad = [k for k in kinds if k not in ("html",) + STATIC_FORMATS]
    if bad:
        raise ValueError(f"format(s) {bad} not supported; use html, png, svg or pdf")
    path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in kinds:
        target = path.with_suffix(f".{kind}")
        if kind == "html":
            fig.write_html(target, include_plotlyjs=True, full_html=True)
        else:
            _write_static(fig, target, kind, scale)
        written.append(target)
    return written


def _write_static(fig: go.Figure, target: Path, kind: str, scale: float) -> None:
    try:
        import kaleido  # noqa: F401
    except ImportError:
        raise ExportError(f"writing {target.name} needs kaleido: pip install 'phaseinterp[export]'") from None
    browser = find_browser()
    if browser is None:
        raise ExportError(
            f"writing {target.name} needs a local Chromium for kaleido (Debian: apt-get install chromium) "
            "or BROWSER_PATH pointing at one"
        )
    os.environ.setdefault("BROWSER_PATH", browser)
    try:
        fig.write_image(target, format=kind, scale=scale)
    except Exception as err:  # kaleido wraps browser failures in several exception types
        raise ExportError(f"kaleido could not write {target}: {err}") from err
