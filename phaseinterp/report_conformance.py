"""The report's conformance section (issue 24): a light `phaseinterp.conformance` run of the
report's model (own family only): decoding and chunked prefill against the full forward, per
answer phase and per cut phase, plus bfloat16."""

from __future__ import annotations

from typing import Any

N_PER_RESIDUE = 2  # light: 48 prompts x 4 answer phases for the zoo task; the CLI defaults to 8


def conformance_report(model, task, out, summary: dict, figures: dict, tables: dict, log) -> None:
    """Add the ``conformance`` figure, table, CSV and summary entry (skipped, with a log line, for
    a model without phaseinterp's own cache)."""
    from phaseinterp._files import atomic_write_text
    from phaseinterp.engines import conformance

    if not hasattr(model, "init_cache"):
        log("      conformance: skipped (not a phaseinterp CompressedTransformer)")
        return
    log(f"[+] conformance: decode, chunked prefill, bfloat16 vs the full forward ({N_PER_RESIDUE} prompts/residue)")
    result = conformance(model, task, ("decode", "chunked_prefill", "dtype"), dtypes=("bfloat16",),
                         n_per_residue=N_PER_RESIDUE, progress=False)
    columns = ["setting", "kind", "phase", "n", "max_abs_diff", "mean_abs_diff", "agreement", "accuracy_diff",
               "statistic", "tolerance", "passed"]
    atomic_write_text(out / "data" / "conformance.csv", result.table.to_csv(index=False))
    summary["conformance"] = result.to_dict()
    figures["conformance"] = result.plot()
    tables["conformance"] = _table_html(result.table[columns])


def _table_html(frame) -> Any:
    from phaseinterp.report import _frame_html

    return _frame_html(frame, "Conformance per setting and phase (|d log p| of next-token log-probs)")
