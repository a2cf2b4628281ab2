"""The published numbers loaded into the toolkit's objects (`phaseinterp.paper`)."""


from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from phaseinterp import stats
from phaseinterp.errors import UserInputError
from phaseinterp.interventions.ablation import AblationResult
from phaseinterp.paper.results import PaperCycling, PaperGates
from phaseinterp.profile import PhaseProfile

DATA = Path(__file__).resolve().parent / "data"
QWEN3_QUERY_HEADS = 16  # the controlled runs' backbone (Qwen3-0.6B shape): 16 query heads share the KV heads
BASELINE_STRIDE = 8  # full attention has no stride; its profiles fold by the headline W8/S8 runs' stride
PADDING_ALIASES = {"prefix": "prefix", "pp": "prefix", "in-sequence": "in-sequence", "in_sequence": "in-sequence",
                   "ip": "in-sequence", "needle": "needle"}



# ------------------------------------------------------------------ tables
@functools.lru_cache(maxsize=None)
def _read(name: str) -> pd.DataFrame:
    path = DATA / f"{name}.csv"
    if not path.is_file():
        raise UserInputError(f"{path} is missing: the package data of phaseinterp.paper was not installed (rebuild it "
                             "with python -m phaseinterp.paper.build FIGDATA.json)")
    return pd.read_csv(path, keep_default_na=True)


TABLES = ("runs", "evaluations", "profiles", "knockouts", "gates", "cycling_runs", "cycling", "cycling_scores",
          "concentration", "trajectory")


def table(name: str) -> pd.DataFrame:
    """One shipped table as published (percent, pp): one of `TABLES`."""
    if name not in TABLES:
        raise UserInputError(f"table={name!r} is not a shipped table; valid: {', '.join(TABLES)}")
    return _read(name).copy()


@functools.lru_cache(maxsize=None)
def _source() -> dict:
    return json.loads((DATA / "source.json").read_text(encoding="utf-8"))


def source() -> dict:
    """Where the numbers come from: repository, commit, file, the SHA-256 of ``figdata.json`` and of each
    shipped table, the units, and what the build derived (the baselines' prompt counts)."""
    return json.loads(json.dumps(_source()))


def _cite(run_id: str, padding: str) -> str:
    s = _source()
    return (f"paper: {run_id}, {padding} (figdata.json sha256 {s['figdata_sha256'][:12]}; {s['repository']}@"
            f"{s['commit'][:10]}, {s['file']})")


def evaluations() -> pd.DataFrame:
    """One row per published (run, padding): mean and gap (%, pp) as published, with 95% intervals where
    published, worst and best residue accuracy, and the interval method."""
    return table("evaluations")


def runs() -> pd.DataFrame:
    """One row per published run (31): the 23 controlled runs, 3 full-attention baselines and 5 DeepSeek
    models. Columns: ``id``, ``name``, ``kind``, ``group``, ``W``, ``S``, ``kv_heads``, ``layers``, ``loss``,
    ``paper_panel``, ``stage``, ``n_per_residue``, ``prompt_tokens``, ``padding``, ``mean_pct`` / ``gap_pp``
    with ``_lower`` / ``_upper``, ``worst_pct``, ``best_pct``, and ``in_sequence_*`` (controlled runs)."""
    base = table("runs")
    ev = evaluations()
    cols = {"mean": "mean_pct", "mean_lower": "mean_pct_lower", "mean_upper": "mean_pct_upper", "gap": "gap_pp",
            "gap_lower": "gap_pp_lower", "gap_upper": "gap_pp_upper", "worst": "worst_pct", "best": "best_pct"}
    first = ev[ev.padding != "in-sequence"].rename(columns=cols).drop(columns=["interval"])
    second = ev[ev.padding == "in-sequence"].rename(columns={k: f"in_sequence_{v}" for k, v in cols.items()})
    second = second.drop(columns=["padding", "interval"])
    out = base.merge(first.rename(columns={"run": "id"}), on="id", how="left")
    out = out.merge(second.rename(columns={"run": "id"}), on="id", how="left")
    for column in ("W", "S", "kv_heads", "layers", "n_per_residue", "prompt_tokens"):
        out[column] = out[column].astype("Int64")  # integers, with <NA> where a kind has none
    return out.reset_index(drop=True)


def cycling_runs() -> pd.DataFrame:
    """The 5 gate-cycling runs (id, name, S, kv_heads; ``kvc_w12s12_4kv`` has no other published data)."""
    return table("cycling_runs")


def concentration() -> pd.DataFrame:
    """The concentration plane: per (run, layer, KV head) the key gate's static effective number of
    offsets exp(H(E[alpha])) and per-window E[exp(H(alpha))] (20 runs; digitized from the paper's figure)."""
    return table("concentration")


def trajectory() -> pd.DataFrame:
    """The same two numbers along training for three heads (layers 9, 10, 14) of the baseline."""
    return table("trajectory")


# ------------------------------------------------------------------ names
def _run_row(run: str, kinds: Optional[tuple[str, ...]] = None) -> pd.Series:
    table_runs = table("runs")
    if kinds is not None:
        table_runs = table_runs[table_runs.kind.isin(kinds)]
    if not isinstance(run, str):
        raise UserInputError(f"run={run!r} is not a published run name; valid: {', '.join(table_runs.id)}")
    key = run.strip().lower()
    hit = table_runs[(table_runs.id.str.lower() == key) | (table_runs.name.str.lower() == key)]
    if hit.empty:
        what = f" ({', '.join(kinds)})" if kinds else ""
        raise UserInputError(f"run={run!r} is not a published run{what}; valid: {', '.join(table_runs.id)} "
                             "(or their names, e.g. 'DeepSeek-V4-Flash-Base')")
    return hit.iloc[0]


def resolve(run: str) -> str:
    """The published id of ``run`` (an id or a name)."""
    return str(_run_row(run).id)


def _padding(run_id: str, padding: Optional[str], available: list[str]) -> str:
    if padding is None:
        return available[0]
    key = PADDING_ALIASES.get(str(padding).strip().lower()) if isinstance(padding, str) else None
    if key not in available:
        raise UserInputError(f"padding={padding!r} is not published for {run_id}; valid: {', '.join(available)}")
    return key


# ------------------------------------------------------------------ profiles
def profile(run: str, padding: Optional[str] = None, *, stride: Optional[int] = None,
            n_permutations: int = 1999, seed: int = 0) -> PhaseProfile:
    """The published accuracy by residue of ``run`` as a `PhaseProfile` (fractions; ``source`` names the
    publication; no per-prompt records).

    Controlled runs: 24 residues, prefix or in-sequence padding, the published intervals, no counts
    (``residue_n`` 0; phase intervals NaN unless published). Baselines: 24 residues with counts (n =
    1000 per residue, the count that reproduces the published Wilson bounds), folded by S = 8. DeepSeek
    models: 8 residues with the published counts and Wilson intervals, folded by the model's stride.
    ``stride`` re-folds (a divisor of the residue modulus); the period test runs on the published
    accuracies (``n_permutations``, ``seed``)."""
    row = _run_row(run)
    run_id = str(row.id)
    ev = evaluations()
    padding = _padding(run_id, padding, list(ev[ev.run == run_id].padding))
    prof = table("profiles")
    prof = prof[(prof.run == run_id) & (prof.padding == padding)].sort_values("residue")
    modulus = len(prof)
    own = BASELINE_STRIDE if row.kind == "full attention" else int(row.S)
    fold = own if stride is None else stride
    if isinstance(fold, bool) or not isinstance(fold, (int, np.integer)) or fold < 1 or modulus % fold:
        valid = [d for d in range(1, modulus + 1) if modulus % d == 0]
        raise UserInputError(f"stride={stride!r} does not divide the {modulus} published residues of {run_id}; "
                             f"valid: {', '.join(map(str, valid))}")
    fold = int(fold)
    counted = prof.n.notna().all()
    if counted:
        k, n = prof.correct.to_numpy(np.int64), prof.n.to_numpy(np.int64)
        accuracy = k / n
        if row.kind == "DeepSeek":  # Wilson computed here from the counts (the published ones agree to 0.01 pp)
            lower, upper = stats.wilson_interval(k, n)
        else:
            lower, upper = prof.lower.to_numpy(float) / 100, prof.upper.to_numpy(float) / 100
        phase_k = np.bincount(np.arange(modulus) % fold, weights=k, minlength=fold).astype(np.int64)
        phase_n = np.bincount(np.arange(modulus) % fold, weights=n, minlength=fold).astype(np.int64)
        phase_lower, phase_upper = stats.wilson_interval(phase_k, phase_n)
        homogeneity = stats.homogeneity_test(phase_k, phase_n).p_value
        method = "wilson"
    else:
        k = n = np.zeros(modulus, dtype=np.int64)
        accuracy = prof.accuracy.to_numpy(float) / 100
        lower, upper = prof.lower.to_numpy(float) / 100, prof.upper.to_numpy(float) / 100
        phase_k = phase_n = np.zeros(fold, dtype=np.int64)
        phase_lower = phase_upper = np.full(fold, np.nan)
        cyc = table("cycling")
        clean = cyc[(cyc.run == run_id) & (cyc["shift"] == 0)].sort_values("phase")
        if padding == "prefix" and len(clean) == fold:  # the gate-cycling section published the clean phases
            phase_lower, phase_upper = clean.lower.to_numpy(float) / 100, clean.upper.to_numpy(float) / 100
        homogeneity = float("nan")
        method = "cluster_bootstrap"
    test = stats.detect_period(accuracy, n_permutations=n_permutations, seed=seed)
    label = f"{row['name']} (paper, {padding})"
    if fold != own:
        label += f" [re-folded by S={fold}; {'own stride' if row.kind != 'full attention' else 'default'} {own}]"
    return PhaseProfile(
        label=label, modulus=modulus, stride=fold, residue_correct=np.asarray(k, np.int64),
        residue_n=np.asarray(n, np.int64), residue_accuracy=np.asarray(accuracy, np.float64),
        residue_lower=np.asarray(lower, np.float64), residue_upper=np.asarray(upper, np.float64),
        phase_correct=np.asarray(phase_k, np.int64), phase_n=np.asarray(phase_n, np.int64),
        phase_accuracy=stats.fold_residues(accuracy, fold), phase_lower=np.asarray(phase_lower, np.float64),
        phase_upper=np.asarray(phase_upper, np.float64), interval_method=method, confidence=0.95,
        period=test.period, best_period=test.best_period, period_p_value=test.p_value,
        period_attainable_p=test.min_attainable_p, homogeneity_p_value=float(homogeneity), records=pd.DataFrame({"residue": pd.Series(dtype=np.int64),
                                                                       "phase": pd.Series(dtype=np.int64),
                                                                       "correct": pd.Series(dtype=bool)}),
        axis="target", source=_cite(run_id, padding),
    )


# ------------------------------------------------------------------ knockouts
def knockout(run: str, padding: Optional[str] = None) -> AblationResult:
    """The published per-(layer, KV head) knockout map of ``run`` as an `AblationResult` (``published``;
    relative changes in %; ``plot()`` draws it as `ablate`'s).

    Controlled runs: 24 residues, ``padding`` prefix or in-sequence, the clean profile of the same padding
    attached; KV head h is read by query heads h * 16/kv .. (h + 1) * 16/kv - 1. Also ``full_attn_1kv``
    (folded by 8) and ``flash_base`` (43 whole-layer units, residue mod 8, stride 4), without a published
    clean profile."""
    row = _run_row(run)
    run_id = str(row.id)
    ko = table("knockouts")
    ko = ko[ko.run == run_id]
    if ko.empty:
        have = list(dict.fromkeys(table("knockouts").run))
        raise UserInputError(f"no knockout map is published for {run_id}; valid: {', '.join(have)}")
    available = list(dict.fromkeys(ko.padding))
    if available == ["figure"]:
        if padding not in (None, "figure"):
            raise UserInputError(f"padding={padding!r}: {run_id} has one published knockout map (the knockout figure's, "
                                 "padding not stated); valid: None")
        padding = "figure"
    else:
        padding = _padding(run_id, padding, available)
    ko = ko[ko.padding == padding].sort_values(["layer", "kv_head"])
    modulus = int(ko.modulus.iloc[0])
    change = ko[[f"r{r}" for r in range(modulus)]].to_numpy(float)
    scope = str(ko.scope.iloc[0])
    if scope == "layer":
        heads = [()] * len(ko)
    else:
        kv = int(ko.kv_head.max()) + 1
        group = QWEN3_QUERY_HEADS // kv
        heads = [tuple(range(h * group, (h + 1) * group)) for h in ko.kv_head]
    units = pd.DataFrame({"layer": ko.layer.to_numpy(int), "kv_head": ko.kv_head.to_numpy(int), "heads": heads})
    if run_id == "flash_base":
        stride = 4
    elif row.kind == "full attention":
        stride = modulus
    else:
        stride = int(row.S)
    clean = None
    if padding != "figure":
        clean = profile(run_id, padding, n_permutations=1).residue_accuracy
    return AblationResult(
        units=units, residue=np.zeros(0, dtype=np.int64), clean_correct=np.zeros(0, dtype=bool),
        knockout_correct=np.zeros((0, len(units)), dtype=bool), residue_modulus=modulus, stride=stride, scope=scope,
        model_label=f"{row['name']} (paper, {padding if padding != 'figure' else 'knockout figure'})",
        published_change=change, published_clean=clean, source=_cite(run_id, padding),
    )


# ------------------------------------------------------------------ gates and cycling
def gates(run: str) -> PaperGates:
    """The published gate profiles of ``run`` (9 runs) beside its prefix-padding knockout folded to
    phases: per (layer, KV head, phase) ``key_gate`` and ``value_gate`` (gate mass at the phase over its
    uniform share, 1 = uniform; the value gate rolled by -1, aligned with the key at the phase) and
    ``knockout`` (relative change, %). A `PaperGates` result."""
    run_id = resolve(run)
    g = table("gates")
    g = g[g.run == run_id]
    if g.empty:
        have = list(dict.fromkeys(table("gates").run))
        raise UserInputError(f"no gate profiles are published for {run_id}; valid: {', '.join(have)}")
    row = _run_row(run_id)
    highlight = _source()["derived"]["gate_highlight_layers"].get(run_id, [])
    frame = g.drop(columns=["run", "mode", "tied"]).reset_index(drop=True)
    return PaperGates(run=run_id, model_label=f"{row['name']} (paper)", window=int(row.W), stride=int(row.S),
                      kv_heads=int(row.kv_heads), layers=int(row.layers), mode=str(g["mode"].iloc[0]),
                      tied=bool(g.tied.iloc[0]), gates=frame, highlight=tuple(int(x) for x in highlight),
                      source=_cite(run_id, "prefix"))


def cycling(run: str) -> PaperCycling:
    """The published gate-cycling run ``run`` (5 runs, 6 shifts each): clean and shifted accuracy per
    phase with intervals, the paper's R² (``r2x`` without the last phase, ``r2i`` interior, ``r2a`` all
    phases), and the toolkit's `cycling_scores` computed on the same profiles (``scores``;
    ``to_frame()``: one row per shift, the paper's beside the toolkit's). A `PaperCycling` result."""
    cr = cycling_runs()
    key = run.strip().lower() if isinstance(run, str) else run
    hit = cr[(cr.id.str.lower() == key) | (cr.name.str.lower() == key)] if isinstance(key, str) else cr.iloc[0:0]
    if hit.empty:
        raise UserInputError(f"run={run!r} has no published gate cycling; valid: {', '.join(cr.id)}")
    row = hit.iloc[0]
    cyc = table("cycling")
    cyc = cyc[cyc.run == row.id].drop(columns=["run"]).sort_values(["shift", "phase"]).reset_index(drop=True)
    for col in ("observed", "lower", "upper", "predicted"):
        cyc[col] = cyc[col] / 100
    published = table("cycling_scores")
    published = published[published.run == row.id].drop(columns=["run"]).reset_index(drop=True)
    return PaperCycling(run=str(row.id), model_label=f"{row['name']} (paper)", stride=int(row.S),
                        kv_heads=int(row.kv_heads), profiles=cyc, published=published,
                        source=_cite(str(row.id), "prefix"))
