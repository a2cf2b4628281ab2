"""The report: a self-contained folder (index.html, PNGs, data/*.csv, summary.json) of every
experiment on one model: phase profile (model + full-attention twin), per-KV-head mean replacement,
gate cycling (whole profile and one unit at a time), gate statistics, conformance, and optional
DeepSeek-V4 and remedy sections.

- `phaseinterp.report.build`: `build_report`, `ReportSettings`, `Report`, the section list;
- `phaseinterp.report.section`: the section protocol (inputs, compute, render; seconds per section);
- `phaseinterp.report.sections`: one module per part of the page;
- `phaseinterp.report.models`: which model (checked, peeked at from config.json, loaded, named);
- `phaseinterp.report.page`: index.html in house style;
- `phaseinterp.report.check`: a headless-Chromium check of a written report
  (``phaseinterp check-report DIR``).
"""

from phaseinterp.report.build import SECTIONS, Report, ReportSettings, build_report, check_report_dir
from phaseinterp.report.models import check_twin, data_name, model_label

__all__ = ["SECTIONS", "Report", "ReportSettings", "build_report", "check_report_dir", "check_twin", "data_name",
           "model_label"]
