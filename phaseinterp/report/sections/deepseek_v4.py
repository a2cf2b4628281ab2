"""The DeepSeek-V4 report section (`build_report(deepseek_v4=...)`): for a model from `phaseinterp.from_hf`,
the wrapper check (max |wrapped - plain HF logits|), the layer schedule, and phase through the indexer
(`indexer_phase`). ``deepseek_v4_section(model, task, out_dir)`` returns ``{"summary", "figures",
"tables"}`` and writes its CSVs under ``out_dir/data``."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Callable, Optional, Union

import pandas as pd

from phaseinterp._files import atomic_write_text
from phaseinterp.errors import UserInputError
from phaseinterp.interventions.indexer import indexer_phase
from phaseinterp.models.hf.against_hf import check_against_transformers
from phaseinterp.models.protocol import phase_model
from phaseinterp.plot import profiles_figure
from phaseinterp.profile import phase_profile
from phaseinterp.report.models import data_name
from phaseinterp.report.section import ReportContext, Section, write_profile_csvs
from phaseinterp.tasks import resolve_task
from phaseinterp.zoo import deepseek_v4 as hf_zoo


def deepseek_v4_section(model, task=None, out_dir: Union[str, Path, None] = None, *, n_per_residue: int = 24,
                        seed: int = 0, batch_size: int = 32, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """The DeepSeek-V4 section for ``model`` (a `HookedDeepseekV4`) on ``task`` (default: its stored task)."""
    if phase_model(model).family != "deepseek_v4":
        raise UserInputError("deepseek_v4_section needs a wrapped DeepSeek-V4 (phaseinterp.from_hf / load_hf)")
    task = resolve_task(model, task)
    batch = task.generate(n_per_residue, seed=seed, strict=False)
    cfg = model.cfg
    log(f"[dsv4] wrapper check and indexer selection: {len(batch)} prompts")
    worst, tied_apart, apart, rows = 0.0, 0, 0, 0
    for i in range(0, min(len(batch), 4 * batch_size), batch_size):
        check = check_against_transformers(model, batch.tokens[i : i + batch_size].to(model.device))
        worst = max(worst, check.max_abs_diff)
        rows, tied_apart, apart = rows + check.rows, tied_apart + check.rows_tied_apart, apart + check.rows_apart
    layers = pd.DataFrame({
        "layer": range(cfg.n_layers),
        "type": list(cfg.layer_types),
        "rate": [cfg.layer_stride(layer) for layer in range(cfg.n_layers)],
        "slots_per_entry": [cfg.layer_window(layer) for layer in range(cfg.n_layers)],
    })
    summary: dict[str, Any] = {"wrapper_max_abs_logit_diff": worst, "indexer_rows_compared": rows,
                               "indexer_rows_tied_apart": tied_apart, "indexer_rows_apart": apart,
                               "layers": layers.to_dict(orient="records"),
                               "index_topk": cfg.index_topk, "sliding_window": cfg.sliding_window}
    figures: dict[str, Any] = {}
    tables = {"dsv4_layers": layers.to_html(index=False, border=0)}
    csvs = {"dsv4_layers": layers}
    if "compressed_sparse_attention" in cfg.layer_types:
        idx = indexer_phase(model, task, prompts=batch, batch_size=batch_size)
        summary["indexer"] = idx.to_dict()
        figures["indexer_phase"] = idx.plot()
        tables["indexer_phase"] = idx.to_frame().to_html(index=False, border=0, float_format="%.3f")
        csvs.update(indexer_phase=idx.to_frame(), indexer_records=idx.records)
    if out_dir is not None:
        data = Path(out_dir) / "data"
        data.mkdir(parents=True, exist_ok=True)
        for name, frame in csvs.items():
            atomic_write_text(data / f"{name}.csv", frame.to_csv(index=False))
    return {"summary": summary, "figures": figures, "tables": tables}


def load_deepseek_v4(model_or_name, device):
    """A wrapped DeepSeek-V4 or a shipped HF-format zoo name -> the wrapped model (checked before any work)."""
    if not isinstance(model_or_name, str):
        if phase_model(model_or_name).family != "deepseek_v4":
            raise UserInputError(f"deepseek_v4={type(model_or_name).__name__} is not a wrapped DeepSeek-V4 "
                             "(phaseinterp.from_hf / load_hf) or a shipped HF zoo name")
        return model_or_name
    if model_or_name not in hf_zoo.available():
        raise UserInputError(f"deepseek_v4={model_or_name!r} is not a shipped HF DeepSeek-V4 zoo model "
                         f"(shipped: {', '.join(hf_zoo.available()) or 'none'})")
    return hf_zoo.load(model_or_name, device=device)


def _logit_check_words(summary: dict) -> str:
    """The wrapper check in words (`check_against_transformers`): identical logits are said to be
    identical, and the indexer's exact ties are counted."""
    diff = summary["wrapper_max_abs_logit_diff"]
    same = ("identical to plain transformers' (largest difference 0)" if diff == 0
            else f"within {diff:.2g} of plain transformers'")
    words = f"With transformers' indexer selection in place, its logits are {same} on the section's prompts."
    rows, tied, apart = (summary[k] for k in ("indexer_rows_compared", "indexer_rows_tied_apart", "indexer_rows_apart"))
    if apart:
        return words + f" Its own selection differs from transformers' beyond exact ties in {apart} of {rows} rows."
    return words + (f" Its own selection is transformers' in all {rows} indexer rows up to exact ties "
                    f"({tied} rows choose differently among entries of equal score: such ties are not part of "
                    "the model).")


class DeepseekV4(Section):
    """A Hugging Face DeepSeek-V4's phase profile (at its own compression rate) and `deepseek_v4_section`."""

    name = "DeepSeek-V4"

    def skip_reason(self, ctx: ReportContext) -> Optional[str]:
        return None if ctx.deepseek_v4 is not None else ""

    def compute(self, ctx: ReportContext) -> dict[str, Any]:
        model = ctx.deepseek_v4
        task = resolve_task(model)
        name = getattr(model, "metadata", {}).get("zoo_name", "DeepSeek-V4")
        n = ctx.settings.ablation_per_residue
        ctx.log(f"[dsv4] {name}: phase profile, {n} prompts x {task.residue_modulus} residues")
        profile = phase_profile(model, task, n_per_residue=n, label=f"{name} (HF DeepSeek-V4)", progress=ctx.progress)
        section = deepseek_v4_section(model, task, ctx.out, n_per_residue=min(n, 24), log=ctx.log)
        return {"name": name, "profile": profile, "section": section}

    def render(self, ctx: ReportContext, result: dict[str, Any]) -> None:
        name, profile, section = result["name"], result["profile"], result["section"]
        write_profile_csvs(ctx.out, data_name(ctx.deepseek_v4), profile, parts=("residues", "phases"))
        ctx.summary["profiles"].append(profile.to_dict())
        ctx.summary["deepseek_v4"] = {"model": name, **section["summary"]}
        ctx.figures["dsv4_profile"] = profiles_figure([profile])
        ctx.tables["dsv4_profile"] = (
            f"<p>{html.escape(name)}: the Hugging Face DeepSeek-V4 architecture (transformers' modules, wrapped by "
            f"<code>phaseinterp.from_hf</code> without copying weights), trained here on the same retrieval task. "
            f"{_logit_check_words(section['summary'])}</p>"
            + section["tables"]["dsv4_layers"])
        for key, fig in section["figures"].items():
            ctx.figures[f"dsv4_{key}" if not key.startswith("dsv4") else key] = fig
        if "indexer_phase" in section["tables"]:
            ctx.tables["dsv4_indexer_phase"] = (
                "<p>How often the CSA Lightning Indexer keeps the compressed entry that holds the target, by target "
                "phase: whether top-k selection itself has a period.</p>" + section["tables"]["indexer_phase"])


__all__ = ["DeepseekV4", "deepseek_v4_section", "load_deepseek_v4"]
