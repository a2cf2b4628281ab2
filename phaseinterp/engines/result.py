"""`ConformanceResult`: per-phase agreement of engines with the reference forward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from phaseinterp._checks import check_name
from phaseinterp.results import Result, plotting


@dataclass(frozen=True, eq=False, repr=False)
class ConformanceResult(Result):
    """What `phaseinterp.conformance` measured: one ``table`` row per setting x phase, one ``records``
    row per (setting, cut phase, answer phase, prompt).

    ``table`` columns: ``mode``, ``setting`` (the mode, a dtype or an engine name), ``kind`` ("answer":
    ``answer_pos mod stride``; "cut": the cut's phase mod ``cut_period``), ``phase``, ``n``,
    ``max_abs_diff`` / ``mean_abs_diff`` (|difference of next-token log-probs|), top-1 ``agreement`` with
    its Wilson interval, ``ref_accuracy``, ``accuracy``, the paired ``accuracy_diff`` with a bootstrap
    interval, and the verdict's ``statistic``, ``tolerance`` and ``passed`` (`DEFAULT_TOLERANCE`)."""

    label: str
    stride: int
    cut_period: int
    chunk: int
    modes: tuple
    settings: tuple
    tolerance: dict
    skipped: dict
    n_prompts: int
    seq_len: int
    seed: int
    confidence: float
    table: pd.DataFrame
    records: pd.DataFrame

    # ------------------------------------------------------------ reading
    @property
    def passed(self) -> bool:
        """Every setting passed at every phase (skipped dtypes are listed in ``skipped``)."""
        return bool(self.table["passed"].all()) if len(self.table) else True

    def failing_phases(self, setting: str, kind: str = "answer") -> tuple[int, ...]:
        """The phases (``kind`` "answer" or "cut") at which ``setting`` exceeded its tolerance."""
        check_name("kind", kind, ("answer", "cut"))
        check_name("setting", setting, self.settings)
        rows = self.table[(self.table["setting"] == setting) & (self.table["kind"] == kind)]
        return tuple(int(p) for p in rows.loc[~rows["passed"], "phase"])

    def verdicts(self) -> pd.DataFrame:
        """Setting x phase grid of verdicts ("pass"/"FAIL"), answer phases then cut phases."""
        frame = self.table.assign(column=self.table["kind"] + " " + self.table["phase"].astype(str),
                                  verdict=np.where(self.table["passed"], "pass", "FAIL"))
        return frame.pivot(index="setting", columns="column", values="verdict").reindex(
            [s for s in self.settings if s in set(frame["setting"])])

    def to_dict(self) -> dict[str, Any]:
        """Headline: per setting, the failing answer phases (and cut phases), the largest
        |d log p| and its tolerance; the overall verdict."""
        out: dict[str, Any] = {"label": self.label, "stride": self.stride, "cut_period": self.cut_period,
                               "n_prompts": self.n_prompts, "passed": self.passed}
        for setting in self.settings:
            rows = self.table[self.table["setting"] == setting]
            if not len(rows):
                continue
            out[f"{setting}: max_abs_diff"] = float(rows["max_abs_diff"].max())
            statistic, bound = self.tolerance[setting]
            out[f"{setting}: mean_abs_diff"] = float(rows["mean_abs_diff"].max())
            out[f"{setting}: tolerance"] = f"{statistic} <= {bound:g}"
            out[f"{setting}: failing answer phases"] = list(self.failing_phases(setting, "answer"))
            if (rows["kind"] == "cut").any():
                out[f"{setting}: failing cut phases"] = list(self.failing_phases(setting, "cut"))
            answer = rows[rows["kind"] == "answer"]
            out[f"{setting}: min agreement"] = float(answer["agreement"].min())
        for dtype, reason in self.skipped.items():
            out[f"{dtype}: skipped"] = reason
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per (setting, cut phase, answer phase, prompt) (see `phaseinterp.engines.check`)."""
        return self.records.copy()

    def plot(self) -> Any:
        """Heatmap: setting (rows) x phase (columns) of log10 max |d log p|, cells marked pass/FAIL."""
        return plotting().conformance.conformance_figure(self)


__all__ = ["ConformanceResult"]
