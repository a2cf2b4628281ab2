"""The report as a browser sees it: `check_page` renders ``index.html`` in headless Chromium (networking
off) and lists figures that drew no plot elements, elements sticking out of the page, and ``None`` /
``nan`` / ``[]`` where a value belongs; `first_screen_png` writes the first screen as a PNG.
Needs a Chromium (`phaseinterp.plot.export.find_browser`)."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Union

from phaseinterp._checks import check_int, check_real
from phaseinterp._files import check_file_target, expand_user, is_path, write_file_atomically
from phaseinterp.errors import MissingPathError, UserInputError
from phaseinterp.plot.export import find_browser

MARKER = "phaseinterp-check"

# Runs in the page after load: figures, overflow, bad texts -> JSON in <pre id=MARKER>.
_SCRIPT = r"""
<script>
window.addEventListener('load', function () { setTimeout(function () {
  var width = document.documentElement.clientWidth;
  var figures = [];
  document.querySelectorAll('.plotly-graph-div').forEach(function (div) {
    var drawn = 0;
    div.querySelectorAll('.cartesianlayer .trace path, .cartesianlayer .trace image, .cartesianlayer .hm image, '
                         + '.polarlayer .trace path, .pielayer .trace path').forEach(function (el) {
      if (el.tagName.toLowerCase() === 'image') {
        var href = el.getAttribute('href') || el.getAttribute('xlink:href') || '';
        if (href.indexOf('data:') === 0) drawn++;
        return;
      }
      var d = el.getAttribute('d') || '';
      if (d.length > 3 && d.indexOf('NaN') < 0 && d !== 'M0,0Z') {
        var box = el.getBBox();
        if (box.width > 0 || box.height > 0) drawn++;
      }
    });
    // a title or subplot title (plotly draws them as one SVG text line each) reaching past the
    // figure's own SVG is cut off there: plotly neither wraps nor clips it to fit
    var cut = [];
    var svg = div.querySelector('svg.main-svg');
    if (svg) {
      var sr = svg.getBoundingClientRect();
      div.querySelectorAll('.infolayer .gtitle, .infolayer .annotation-text').forEach(function (t) {
        var tr = t.getBoundingClientRect();
        if (tr.width > 0 && (tr.right > sr.right + 1 || tr.left < sr.left - 1))
          cut.push((t.textContent || '').slice(0, 120));
      });
    }
    figures.push({id: div.id, drawn: drawn, cut_titles: cut});
  });
  var overflow = [];
  document.querySelectorAll('body *').forEach(function (el) {
    if (!(el instanceof HTMLElement) || el.id === '""" + MARKER + r"""') return;
    var r = el.getBoundingClientRect();
    if (r.width === 0 || (r.right <= width + 1 && r.left >= -1)) return;
    for (var a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      var o = getComputedStyle(a).overflowX;
      if (o !== 'visible') {
        var ar = a.getBoundingClientRect();
        if (ar.right <= width + 1 && ar.left >= -1) return;  // scrolls inside a box that fits
      }
    }
    overflow.push({tag: el.tagName.toLowerCase(), id: el.id, cls: String(el.className).slice(0, 60),
                   right: Math.round(r.right), text: (el.innerText || '').slice(0, 80)});
  });
  var bad = [];
  var walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  var pattern = /(^|[^A-Za-z_])(None|nan|NaN|undefined|null)([^A-Za-z_]|$)|\[\]/;
  for (var n = walker.nextNode(); n; n = walker.nextNode()) {
    var p = n.parentElement;
    if (!p || /^(SCRIPT|STYLE)$/.test(p.tagName) || p.closest('#""" + MARKER + r"""')) continue;
    var t = n.textContent.trim();
    if (t && pattern.test(t)) bad.push(t.slice(0, 120));
  }
  var out = document.createElement('pre');
  out.id = '""" + MARKER + r"""';
  out.textContent = JSON.stringify({width: width, scroll_width: document.documentElement.scrollWidth,
                                    figures: figures, overflow: overflow.slice(0, 50), bad_text: bad.slice(0, 50)});
  document.body.appendChild(out);
}, 300); });
</script>
"""


def _chromium(args: list[str], profile: Path, timeout: float) -> subprocess.CompletedProcess:
    browser = find_browser()
    if browser is None:
        raise MissingPathError("no Chromium found (install chromium, or set BROWSER_PATH)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={profile}"]
    return subprocess.run([browser, *flags, *args], capture_output=True, text=True, timeout=timeout)


def report_page(page: Union[str, os.PathLike], name: str = "page") -> Path:
    """The HTML file to check for ``page``: an ``.html`` file, or a report folder's ``index.html``
    (relative paths are relative to the working directory). A missing path, a folder without
    ``index.html`` or a file that is not an HTML page is a one-line error naming it."""
    if not is_path(page):
        raise UserInputError(f"{name}={page!r} is not a path to a report folder or an HTML page")
    path = Path(expand_user(page)).resolve()  # a file:// URI needs an absolute path; relative ones are from the working directory
    if not path.exists():
        raise MissingPathError(f"{name}={str(page)!r} does not exist (expected a report folder or its index.html)")
    if path.is_dir():
        if not (path / "index.html").is_file():
            raise MissingPathError(f"{name}={str(page)!r} is a folder without index.html: not a report folder "
                                   "(written by `phaseinterp demo` / `phaseinterp report` / build_report)")
        return path / "index.html"
    if path.suffix.lower() not in (".html", ".htm"):
        raise UserInputError(f"{name}={str(page)!r} is not an HTML page (expected a report folder or an .html file)")
    try:
        head = path.read_bytes()[:4096].decode("utf-8").lower()
    except UnicodeDecodeError:
        head = ""
    if "<html" not in head and "<!doctype html" not in head and "<body" not in head:
        raise UserInputError(f"{name}={str(page)!r} is not an HTML page (no <html> or <body> in its first 4 KB)")
    return path


def _chromium_window(width, height, timeout) -> tuple[int, int, float]:
    """Chromium's window (px, each >= 1) and time limit (seconds > 0), checked before a page is read."""
    width, height = (check_int(name, value, 1, why=" (px of Chromium's window)")
                     for name, value in (("width", width), ("height", height)))
    return width, height, check_real("timeout", timeout, 0.0, low_open=True, why=" (seconds for Chromium)")


def check_page(page: Union[str, Path], width: int = 1400, height: int = 1000, timeout: float = 120) -> dict:
    """Render ``page`` (an HTML file, or a report folder's index.html) at ``width`` px and return
    ``{"width", "scroll_width", "figures": [{"id", "drawn", "cut_titles"}], "overflow": [...], "bad_text": [...]}``.
    ``drawn`` counts plot elements with geometry inside each figure's plot area; ``cut_titles`` the
    figure's title and subplot titles that reach past its edge (plotly cuts them there)."""
    width, height, timeout = _chromium_window(width, height, timeout)
    page = report_page(page)
    with tempfile.TemporaryDirectory(prefix="phaseinterp-check-") as tmp:
        text = page.read_text()
        cut = text.rfind("</body>")
        # beside the page, so relative links resolve; a new file of its own (mkstemp), never a user's
        fd, probe_name = tempfile.mkstemp(dir=page.parent, prefix=f".{page.stem}.check-", suffix=".html")
        probe = Path(probe_name)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text[:cut] + _SCRIPT + text[cut:] if cut >= 0 else text + _SCRIPT)
            run = _chromium([f"--window-size={width},{height}", "--virtual-time-budget=15000", "--dump-dom",
                             probe.as_uri()], Path(tmp) / "profile", timeout)
        finally:
            probe.unlink(missing_ok=True)
    found = re.search(rf'<pre id="{MARKER}">(.*?)</pre>', run.stdout, flags=re.S)
    if found is None:
        raise RuntimeError(f"the page's check did not run (Chromium exit {run.returncode}): {run.stderr[-1000:]}")
    return json.loads(html.unescape(found.group(1)))


def problems(result: dict) -> list[str]:
    """`check_page`'s answer as a list of human-readable problems (empty: the page is fine)."""
    if not result["figures"]:  # nothing was checked: never "ok" (every report has figures)
        return ["the page has no figures: nothing to check (is it a phaseinterp report?)"]
    out = [f"figure {f['id']} drew no plot elements" for f in result["figures"] if f["drawn"] == 0]
    out += [f"figure {f['id']}: title cut off at the figure's edge: {t!r}"
            for f in result["figures"] for t in f.get("cut_titles", [])]
    if result["scroll_width"] > result["width"] + 1:
        out.append(f"the page is {result['scroll_width']} px wide in a {result['width']} px window")
    out += [f"<{o['tag']} id={o['id']!r} class={o['cls']!r}> reaches x = {o['right']} px "
            f"(window {result['width']} px): {o['text']!r}" for o in result["overflow"]]
    out += [f"text says {t!r}" for t in result["bad_text"]]
    return out


def first_screen_png(page: Union[str, Path], png: Union[str, Path], width: int = 1400, height: int = 900,
                     timeout: float = 120, *, overwrite: bool = False) -> Path:
    """Write the first ``width`` x ``height`` px of ``page`` (a report's index.html or its folder) to
    ``png``. An existing ``png`` is replaced only with ``overwrite=True`` (checked before Chromium
    starts); the file is written whole or not at all (`phaseinterp._files.write_file_atomically`)."""
    width, height, timeout = _chromium_window(width, height, timeout)
    page = report_page(page)
    if isinstance(png, (bytes, bool)) or not isinstance(png, (str, os.PathLike)) or Path(png).suffix.lower() != ".png":
        raise UserInputError(f"png={png!r} must be a path ending in .png")
    png = check_file_target(png, overwrite=overwrite, name="png",
                            flag="overwrite=True (python -m phaseinterp.report.check: --overwrite) to replace it")
    with tempfile.TemporaryDirectory(prefix="phaseinterp-shot-") as tmp:
        shot = Path(tmp) / "shot.png"
        _chromium([f"--window-size={width},{height}", "--virtual-time-budget=15000", f"--screenshot={shot}",
                   page.resolve().as_uri()], Path(tmp) / "profile", timeout)
        if not shot.is_file():
            raise RuntimeError("Chromium wrote no screenshot")
        return write_file_atomically(png, shot.read_bytes(), overwrite=overwrite, name="png")
