"""Writing figures: interactive HTML always, PNG/SVG/PDF offline through kaleido + a local Chromium."""

from __future__ import annotations

import functools
import os
import shutil
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

import plotly.graph_objects as go
import plotly.io as pio

from phaseinterp._checks import check_real
from phaseinterp._files import (check_file_target, move_file_into_place, temporary_file_beside, through_links,
                                write_file_atomically)
from phaseinterp.errors import UserInputError

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


def load_kaleido() -> Any:
    """kaleido (the [export] extra: static images), imported on first use; None when not installed."""
    try:
        import kaleido
    except ImportError:
        return None
    return kaleido


def static_export_available() -> bool:
    return load_kaleido() is not None and find_browser() is not None


def save(fig: go.Figure, path: Union[str, Path], formats: Iterable[str] | None = None, scale: float = 2.0, *,
         overwrite: bool = False, name: str = "path") -> list[Path]:
    """Write ``fig`` to ``path``; the suffix picks the format (``.html``, ``.png``, ``.svg``, ``.pdf``; none:
    ``.html``). With ``formats`` the stem of ``path`` is written once per format. Returns the written
    paths. Static formats need ``phaseinterp[export]`` and a Chromium, else an `ExportError` says so. An
    existing file is replaced only with ``overwrite=True``; every target is checked first
    (`figure_targets`) and each is written whole or not at all. ``name``: the argument errors name."""
    if not isinstance(fig, go.Figure):
        raise UserInputError(f"fig={type(fig).__name__} is not a plotly Figure (a result's .plot() returns one)")
    scale = _check_scale(scale)
    written = []
    for kind, target in figure_targets(path, formats, overwrite=overwrite, name=name):
        written.append(write_file_atomically(target, functools.partial(_write_one, fig, kind, scale),
                                             overwrite=overwrite, name=name))
    return written


def figure_targets(path: Union[str, Path], formats: Iterable[str] | None = None, *, overwrite: bool = False,
                   name: str = "path") -> list[tuple[str, Path]]:
    """The (format, file) pairs `save` would write for ``path`` and ``formats``, each checked by the write
    rule (and a static format's Chromium), so a caller can refuse a bad target before the work."""
    check_file_target(path, overwrite=True, name=name)  # a path at all (existing targets: per format below)
    path = Path(path)
    kinds = list(formats) if formats is not None else [path.suffix.lstrip(".").lower() or "html"]
    bad = [k for k in kinds if k not in ("html",) + STATIC_FORMATS]
    if bad:
        raise UserInputError(f"{name}={str(path)!r}: format(s) {bad} not supported; use .html, .png, .svg or .pdf")
    targets = [check_file_target(path.with_suffix(f".{kind}"), overwrite=overwrite, name=name) for kind in kinds]
    if any(kind != "html" for kind in kinds):
        _check_static(path.name)
    return list(zip(kinds, targets))


def _check_scale(scale: float) -> float:
    """``scale`` as a Python float > 0: the static image's size factor (2 = twice the figure's pixels)."""
    return check_real("scale", scale, 0.0, low_open=True, why=" (the static image's size factor)")


def html_fragment(fig: go.Figure, include_plotlyjs: Union[bool, str] = True) -> str:
    """The figure as a ``<div>`` for a page or a notebook cell (plotly.js inline, ``"cdn"`` or left out)."""
    return pio.to_html(fig, full_html=False, include_plotlyjs=include_plotlyjs)


def _write_one(fig: go.Figure, kind: str, scale: float, tmp) -> None:
    """Write ``fig`` as ``kind`` (html or a static format) to the temporary path ``tmp``."""
    if kind == "html":
        fig.write_html(tmp, include_plotlyjs=True, full_html=True)
    else:
        _write_static(fig, tmp, kind, scale)


def save_static(figures: Mapping[Union[str, Path], go.Figure], scale: float = 2.0, *,
                overwrite: bool = False) -> list[Path]:
    """Write every ``{path: figure}`` as a static image (png, svg, pdf by suffix) in ONE kaleido
    session. Returns the paths; `ExportError` when kaleido or Chromium is missing or fails. Existing
    files are replaced only with ``overwrite=True`` (all checked first); images are moved into place once
    all are drawn, so a failure leaves none partial; a link stays a link (`through_links`)."""
    scale = _check_scale(scale)
    given = [check_file_target(p, overwrite=overwrite, name="figures") for p in figures]
    kinds = [t.suffix.lstrip(".").lower() for t in given]
    targets = [through_links(t) for t in given]  # a link stays: the file it points to is written
    bad = sorted({k for k in kinds if k not in STATIC_FORMATS})
    if bad:
        raise UserInputError(f"format(s) {bad} not supported by save_static; use png, svg or pdf")
    if not targets:
        return []
    _check_static(targets[0].name)
    for t in targets:
        t.parent.mkdir(parents=True, exist_ok=True)
    if _warming is not None:
        _warming.join()  # a `static_session` is starting the browser: wait for it rather than start another
    _drop_dead_server()  # a browser that died at start: draw without the session (that path raises at once)
    temporary: list[Path] = []
    figs = list(figures.values())
    try:
        temporary = [temporary_file_beside(t) for t in targets]
        todo = list(range(len(targets)))
        # kaleido returns a failed render's error instead of raising it (and removes that file), and
        # plotly drops the return value: a missing or empty file is the only sign. A render that fails
        # under load is drawn again once; a second failure is an ExportError naming the figure.
        for attempt in range(2):
            if attempt:
                for i in todo:
                    temporary[i].unlink(missing_ok=True)
                    temporary[i] = temporary_file_beside(targets[i])
            try:
                with warnings.catch_warnings():  # a running session already holds plotly's kaleido options
                    warnings.filterwarnings("ignore", message="The kopts argument is ignored if using a server")
                    # each figure's own layout size: plotly 7's write_images draws a list at kaleido's
                    # default 700 x 500 unless the sizes are passed (fig.write_image reads the layout itself)
                    _while_server_lives(functools.partial(
                        pio.write_images, [figs[i] for i in todo], [temporary[i] for i in todo],
                        format=[kinds[i] for i in todo], scale=scale, width=[figs[i].layout.width for i in todo],
                        height=[figs[i].layout.height for i in todo]))
            except Exception as err:  # kaleido wraps browser failures in several exception types
                raise ExportError(f"kaleido could not write {', '.join(t.name for t in targets)}: {err}") from err
            todo = [i for i in todo if not (temporary[i].is_file() and temporary[i].stat().st_size > 0)]
            if not todo:
                break
        if todo:
            raise ExportError(f"kaleido could not draw {', '.join(targets[i].name for i in todo)} (twice): its "
                              "render failed without an error; nothing was written for them")
        for tmp, target in zip(temporary, targets):
            move_file_into_place(tmp, target, overwrite=overwrite, name="figures")
    finally:
        for tmp in temporary:
            tmp.unlink(missing_ok=True)
    return targets


_warming: Optional[threading.Thread] = None


def _server():
    """kaleido's sync server (the browser a `static_session` started), when one is running; else None."""
    server_class = getattr(getattr(load_kaleido(), "_sync_server", None), "GlobalKaleidoServer", None)
    if server_class is None:  # no kaleido, or another kaleido: no session of ours to watch
        return None
    server = server_class()
    return server if server.is_running() and hasattr(server, "_thread") else None


def _drop_dead_server() -> None:
    """Forget a kaleido server whose browser died (its thread ended: Chromium closed right after
    starting, e.g. root without --no-sandbox or a snap stub): a call to it would wait forever."""
    server = _server()
    if server is not None and not server._thread.is_alive():
        server.close(silence_warnings=True)  # the thread is gone: close only resets kaleido's singleton


def _while_server_lives(write: Callable[[], Any], poll: float = 0.2) -> Any:
    """``write()``, watched: when a kaleido server is running, the write runs in a helper thread and an
    `ExportError` is raised as soon as the server's thread dies (its browser crashed), instead of
    waiting forever on kaleido's task queue, which nobody then serves."""
    server = _server()
    if server is None:
        return write()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = write()
        except BaseException as err:  # noqa: BLE001 -- re-raised in the caller's thread
            outcome["error"] = err

    worker = threading.Thread(target=run, name="phaseinterp-kaleido-write", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(poll)
        if worker.is_alive() and not server._thread.is_alive():
            server.close(silence_warnings=True)
            raise ExportError("kaleido's browser (Chromium) stopped while drawing: its server thread ended and no "
                              "image came back; nothing was written (check that Chromium starts here, e.g. as "
                              "root it needs --no-sandbox)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@contextmanager
def static_session(enabled: bool = True) -> Iterator[None]:
    """Start kaleido's browser now, in a background thread, and stop it on exit, so a `save_static`
    inside the block finds it running. Nothing happens when ``enabled`` is false or static export is
    unavailable; when the start fails, `save_static` starts its own browser."""
    global _warming
    if not enabled or _warming is not None or not static_export_available():
        yield
        return
    kaleido = load_kaleido()
    _check_static("the report's figures")
    defaults = pio.defaults
    options = {k: getattr(defaults, k) for k in ("plotlyjs", "mathjax", "headers") if getattr(defaults, k, None)}
    started: list[bool] = []

    def start() -> None:
        try:
            kaleido.start_sync_server(silence_warnings=True, **options)
            started.append(True)
        except Exception:  # noqa: BLE001 -- save_static then starts (and reports) its own browser
            pass

    _warming = threading.Thread(target=start, name="phaseinterp-kaleido-start", daemon=True)
    _warming.start()
    try:
        yield
    finally:
        _warming.join()
        _warming = None
        if started:
            kaleido.stop_sync_server(silence_warnings=True)


def _check_static(name: str) -> None:
    """kaleido and a Chromium are present (`ExportError` naming ``name`` otherwise)."""
    if load_kaleido() is None:
        raise ExportError(f"writing {name} needs kaleido: pip install 'phaseinterp[export]'")
    browser = find_browser()
    if browser is None:
        raise ExportError(
            f"writing {name} needs a local Chromium for kaleido (Debian: apt-get install chromium) "
            "or BROWSER_PATH pointing at one"
        )
    os.environ.setdefault("BROWSER_PATH", browser)


def _write_static(fig: go.Figure, target: Path, kind: str, scale: float) -> None:
    _check_static(target.name)
    try:
        fig.write_image(target, format=kind, scale=scale)
    except Exception as err:  # kaleido wraps browser failures in several exception types
        raise ExportError(f"kaleido could not write {target}: {err}") from err
