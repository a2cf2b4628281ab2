"""Every ``phaseinterp`` command line in README.md and docs/*.md runs as written: each parses with the
command line's own parser (fast), README lists every command the parser has, and a few cheap ones
run end to end in a fresh process (slow)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from phaseinterp.cli.args import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^([ \t]*)```[^\n]*\n(.*?)^\1```", re.S | re.M)


def _commands_in_shell(text: str) -> list[str]:
    """The ``phaseinterp`` invocations in shell text: one per ``&&`` / ``;`` part that starts with
    ``phaseinterp`` or runs it with ``-m phaseinterp`` (torchrun, accelerate launch); the words
    after ``phaseinterp``, as one string."""
    found = []
    for part in re.split(r"&&|;|\|\|", text):
        words = shlex.split(part, comments=True)
        for i, word in enumerate(words):
            if word == "phaseinterp" and (i == 0 or words[i - 1] == "-m"):
                found.append(shlex.join(words[i + 1:]))
                break
    return found


def _is_synopsis(words: str) -> bool:
    """A usage pattern, not a command: optional parts in brackets, alternatives, a COMMAND placeholder."""
    return "[" in words or " | " in words or re.match(r"[A-Z]", words) is not None


def documented_commands() -> list[tuple[str, str]]:
    """(where, words after ``phaseinterp``) for every command line in the docs: in fenced and
    indented code blocks (line continuations joined) and in inline code spans; synopses skipped,
    ``...`` (the rest of the options) dropped."""
    commands = []
    for path in DOCS:
        text = path.read_text()
        blocks = [m.group(2) for m in FENCE.finditer(text)]
        prose = FENCE.sub("", text)
        blocks += [m.group(0) for m in re.finditer(r"(?:^(?: {4,}|\t)\S.*\n)+", prose, re.M)]  # indented code
        spans = [" ".join(m.group(1).split()) for m in re.finditer(r"`([^`]+)`", prose)]
        lines = []
        for block in blocks:
            lines += block.replace("\\\n", " ").splitlines()
        for line in lines + spans:
            if "phaseinterp" not in line or line.lstrip().startswith(("import ", "from ", ">>>")):
                continue
            try:
                found = _commands_in_shell(line)
            except ValueError:  # not shell (unbalanced quotes in prose)
                continue
            for words in found:
                words = " ".join(w for w in words.split() if w not in ("...", "…"))
                if not _is_synopsis(words):
                    commands.append((f"{path.relative_to(ROOT)}: phaseinterp {words}", words))
    return commands


COMMANDS = documented_commands()


def test_the_docs_hold_commands_to_check():
    assert len(COMMANDS) >= 20, COMMANDS  # the extraction still finds them (README alone has ~30)
    assert any(words.startswith("zoo export") for _, words in COMMANDS)


@pytest.mark.parametrize("where, words", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_documented_command_parses(where, words):
    """Placeholders (MODEL, DIR, NAME, URL) parse like any value; what a real value would need (an
    existing folder, a shipped name) is the command's own check, not the parser's."""
    if words in ("", "zoo"):  # `phaseinterp` (or `phaseinterp zoo`) alone prints the command list (cli.main)
        return
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(shlex.split(words))
        except SystemExit as exit_:  # --help exits 0; a bad command line exits 2 with its message
            assert exit_.code == 0, f"{where} does not parse: {err.getvalue().strip()}"


def _parser_commands(parser=None, prefix=()) -> list[str]:
    """Every runnable command of the parser: ``zoo list``, ``experiments remedy``, ``profile`` ..."""
    parser = parser or build_parser()
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _parser_commands(sub, prefix + (name,))
                found += nested or [" ".join(prefix + (name,))]
    return found


def test_readme_lists_every_command():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Commands\n", 1)
    assert len(section) == 2, "README has no '## Commands' section"
    rows = [row.split() for row in re.findall(r"^\| `phaseinterp ([^`]+)`", section[1], re.M)]
    commands = _parser_commands()
    missing = [c for c in commands if not any(row[:len(c.split())] == c.split() for row in rows)]
    assert not missing, f"README's Commands section lacks {missing}"
    assert len(rows) == len(commands), "one row per command"


def _run(*argv: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # fresh processes
@pytest.mark.parametrize("argv", [["--help"], ["zoo", "list"], ["zoo", "export", "--help"], ["check-report", "--help"],
                                  ["memory-plan", "--help"], ["experiments", "remedy", "--help"]])
def test_cheap_commands_run_end_to_end(argv):
    out = _run("-m", "phaseinterp", *argv)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip(), argv


@pytest.mark.slow  # fresh processes; imports transformers
def test_memory_plan_runs():
    """``phaseinterp memory-plan`` on a shipped tiny DeepSeek-V4's config (as docs/deepseek_v4.md runs it on a
    real one)."""
    pytest.importorskip("transformers")
    config = "phaseinterp/zoo/checkpoints/dsv4-tiny"
    if not (ROOT / config / "config.json").is_file():
        pytest.skip("dsv4-tiny is not shipped in this checkout")
    new = _run("-m", "phaseinterp", "memory-plan", config, "--tokens", "128", timeout=300)
    assert new.returncode == 0, new.stderr[-2000:]
    assert "n_params: 298,097" in new.stdout and "one-layer ablation" in new.stdout
