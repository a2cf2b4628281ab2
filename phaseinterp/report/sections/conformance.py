"""The report's conformance section: a light `phaseinterp.conformance` run of the
report's model (own family only): decoding and chunked prefill against the full forward, per
answer phase and per cut phase, plus bfloat16."""

from __future__ import annotations

from typing import Optional

from phaseinterp._files import atomic_write_text
from phaseinterp.engines import conformance
from phaseinterp.report.page import frame_html
from phaseinterp.report.section import ReportContext, Section

N_PER_RESIDUE = 2  # light: 48 prompts x 4 answer phases for the zoo task; the CLI defaults to 8


class Conformance(Section):
    """Decoding, chunked prefill and bfloat16 against the full forward, per phase (own family: the
    check needs phaseinterp's own cache)."""

    name = "conformance"

    def skip_reason(self, ctx: ReportContext) -> Optional[str]:
        return None if hasattr(ctx.model, "init_cache") else "not a phaseinterp CompressedTransformer"

    def compute(self, ctx: ReportContext):
        ctx.log(f"[+] conformance: decode, chunked prefill, bfloat16 vs the full forward ({N_PER_RESIDUE} "
                f"prompts/residue)")
        return conformance(ctx.model, ctx.task, ("decode", "chunked_prefill", "dtype"), dtypes=("bfloat16",),
                           n_per_residue=N_PER_RESIDUE, progress=False)

    def render(self, ctx: ReportContext, result) -> None:
        columns = ["setting", "kind", "phase", "n", "max_abs_diff", "mean_abs_diff", "agreement", "accuracy_diff",
                   "statistic", "tolerance", "passed"]
        atomic_write_text(ctx.out / "data" / "conformance.csv", result.table.to_csv(index=False))
        ctx.summary["conformance"] = result.to_dict()
        ctx.figures["conformance"] = result.plot()
        ctx.tables["conformance"] = frame_html(result.table[columns], "Conformance per setting and phase "
                                                                      "(|d log p| of next-token log-probs)")
