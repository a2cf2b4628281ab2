"""The report: a self-contained folder (index.html, PNGs, data/*.csv, summary.json) of every experiment on
one model. `build` (`build_report`, `ReportSettings`), `section` (the section protocol), `sections`
(one module per part of the page), `models`, `page` (index.html) and `check` (headless-Chromium check)."""

from phaseinterp.report.build import SECTIONS, Report, ReportSettings, build_report, check_report_dir
from phaseinterp.report.models import check_twin, data_name, model_label

__all__ = ["SECTIONS", "Report", "ReportSettings", "build_report", "check_report_dir", "check_twin", "data_name",
           "model_label"]
