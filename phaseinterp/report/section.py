"""The report's section protocol: each section declares the earlier sections whose results it reads
(`Section.inputs`), says when it does not apply (`Section.skip_reason`), computes (`Section.compute`)
and renders (`Section.render`: its CSVs in ``data/``, its ``summary.json`` entry, figure and
table). `run_sections` runs them in order and charges each one's seconds to its name
(``summary["section_seconds"]``, the report's "Run time" table)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from phaseinterp._files import atomic_write_text


class PromptSets:
    """Each prompt set of a report generated once and shared by the sections that use it:
    ``get(task, n_per_residue, seed)`` is ``task.generate(n_per_residue, seed=seed)``, the same
    batch every time it is asked for (tasks are frozen dataclasses, so equal tasks share)."""

    def __init__(self):
        self._sets: dict[tuple, Any] = {}

    def get(self, task, n_per_residue: int, seed: int = 0):
        key = (task, n_per_residue, seed)
        if key not in self._sets:
            self._sets[key] = task.generate(n_per_residue, seed=seed)
        return self._sets[key]


class SectionClock:
    """Seconds per report section (``summary["section_seconds"]``, printed by ``phaseinterp demo``)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    def lap(self, name: str) -> None:
        """Charge the time since the previous lap to ``name`` (added up when a name repeats)."""
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._start
        self._start = now


@dataclass
class ReportContext:
    """What every section may read: the report's model, task and settings, the output folder, the
    shared prompt sets, and (``results``) what earlier sections computed, by section name; what they
    add to the page goes into ``summary``, ``figures`` and ``tables`` (keyed by figure name)."""

    model: Any
    task: Any
    settings: Any
    out: Path
    twin: Any = None
    device: Any = None
    progress: bool = True
    log: Callable[[str], Any] = print
    own_task: bool = True  # the model's stored task (its profile can be reused by the remedy section)
    deepseek_v4: Any = None  # a wrapped HF DeepSeek-V4 for its section, loaded before any work
    remedy: Optional[str] = None  # the zoo name of a staggered-window model for the remedy section
    prompts: PromptSets = field(default_factory=PromptSets)
    results: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, Any] = field(default_factory=dict)


class Section:
    """One part of the report. Subclasses set ``name`` (its row in "Run time") and ``inputs`` (the
    names of earlier sections whose results it reads: it is skipped when one of them did not run),
    and implement `compute` (returns the result, kept in ``ctx.results[name]``) and `render`."""

    name: str = ""
    inputs: tuple[str, ...] = ()

    def skip_reason(self, ctx: ReportContext) -> Optional[str]:
        """Why this section does not apply to ``ctx`` (None: it runs)."""
        return None

    def compute(self, ctx: ReportContext) -> Any:
        raise NotImplementedError

    def render(self, ctx: ReportContext, result: Any) -> None:
        raise NotImplementedError


def run_sections(sections: list[Section], ctx: ReportContext, clock: SectionClock) -> None:
    """Run ``sections`` in order: each one that applies computes and renders, and its seconds are
    charged to its name; a skipped one is logged when it says why (and costs no row)."""
    for section in sections:
        missing = [name for name in section.inputs if name not in ctx.results]
        reason = (f"needs {', '.join(missing)}, which did not run" if missing else section.skip_reason(ctx))
        if reason is not None:
            if reason:
                ctx.log(f"      {section.name}: skipped ({reason})")
            continue
        result = section.compute(ctx)
        ctx.results[section.name] = result
        section.render(ctx, result)
        clock.lap(section.name)


def write_profile_csvs(out: Path, name: str, profile, parts=("residues", "phases", "prompts")) -> None:
    """``data/profile_<name>_<part>.csv`` for each of ``parts`` (``name``: a `data_name`)."""
    frames = {"residues": profile.residue_frame, "phases": profile.phase_frame, "prompts": profile.to_frame}
    for part in parts:
        atomic_write_text(out / "data" / f"profile_{name}_{part}.csv", frames[part]().to_csv(index=False))
