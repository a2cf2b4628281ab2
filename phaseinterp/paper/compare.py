"""Any result beside a published run, in the same statistic (`compare`), and the published runs to set
beside a model (`counterparts`)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from phaseinterp import stats
from phaseinterp._checks import check_int
from phaseinterp.errors import UserInputError
from phaseinterp.interventions.ablation import AblationResult
from phaseinterp.interventions.gate_cycling import CyclingResult
from phaseinterp.paper import published
from phaseinterp.paper.results import PaperComparison, PaperCycling
from phaseinterp.paper.sweep import VARIANTS
from phaseinterp.profile import PhaseProfile, profile_from_records

SPECIALIZED = -50.0  # relative change (%) at which a knockout "hurts" a phase, the threshold both sides use


def compare(result, run: str, padding: Optional[str] = None) -> PaperComparison:
    """``result`` beside the published run ``run`` in the same statistic: a `PaperComparison`.

    - a `PhaseProfile` beside the run's published profile (``padding``: prefix by default), both folded to
      the least common multiple of the two strides on their common residues; a pair with no common fold is
      refused, naming the runs that have one;
    - an `AblationResult` beside the published knockout map, both folded the paper's way to the common
      fold; a unit is specialized when its relative change is <= -50% on 1..3 adjacent phases and no other
      (``detail``: one row per model, layer, kv_head and phase);
    - a `CyclingResult` (or `PaperCycling`) beside a published gate-cycling run: the paper's R² (squared
      correlation without the last phase) per shift for both, and the toolkit's stricter R²."""
    if isinstance(result, PhaseProfile):
        return _profiles(result, run, padding)
    if isinstance(result, AblationResult):
        return _knockouts(result, run, padding)
    if isinstance(result, (CyclingResult, PaperCycling)):
        if padding not in (None, "prefix"):
            raise UserInputError(f"padding={padding!r}: the published gate cycling is under prefix padding; valid: prefix")
        return _cycling(result, run)
    raise UserInputError(f"result={type(result).__name__} cannot be compared with the paper; valid: a PhaseProfile "
                         "(phase_profile), an AblationResult (ablate) or a CyclingResult (gate_cycling_profile)")


# ------------------------------------------------------------------ which runs
def _geometry_key(kind: str, mine: tuple, theirs: tuple) -> tuple:
    """How far a published run's (W, S, KV heads) is from a model's: stride first (it sets the phases),
    then window, then KV heads (ratio), then the sizes of the differences; all zero = same geometry."""
    (w, s, kv), (w2, s2, kv2) = mine, theirs
    heads = abs(math.log2(kv / kv2))
    if kind == "full attention":
        return (0, 0, heads, 0, 0)
    return (int(s != s2), int(w != w2), heads, abs(s - s2), abs(w - w2))


def _geometry_words(kind: str, w, s, kv: int) -> str:
    heads = f"{kv} KV head{'s' if kv != 1 else ''}"
    return f"full attention, {heads}" if kind == "full attention" else f"W{w}/S{s}, {heads}"


def counterparts(config, residues: int = 24, stride: Optional[int] = None) -> pd.DataFrame:
    """The published runs to set beside a model of ``config`` (``window``, ``stride``, ``n_kv_heads``,
    ``is_compressed``), nearest geometry first.

    Candidates: the 23 controlled runs for a compressed model, the 3 full-attention baselines otherwise.
    Distance: stride, then window, then KV heads (by ratio). One row per candidate: ``id``, ``name``,
    ``kind``, ``W``, ``S``, ``kv_heads``, ``geometry``, ``variant``, ``plain``, ``same_geometry``, ``rank`` (0 =
    nearest; equal ranks equally near) and ``common_fold`` (the fold `compare` would use with ``residues``
    and ``stride``; ``<NA>``: it refuses the pair)."""
    for attr in ("stride", "n_kv_heads", "is_compressed"):
        if not hasattr(config, attr):
            raise UserInputError(f"config={type(config).__name__} has no {attr!r}; valid: a model config with window, "
                                 "stride, n_kv_heads and is_compressed (e.g. model.cfg)")
    residues = check_int("residues", residues, 1, why=" (the model's residue count, as compare takes it)")
    stride = int(config.stride) if stride is None else check_int("stride", stride, 1)
    kind = "controlled" if config.is_compressed else "full attention"
    window = getattr(config, "window", None) if config.is_compressed else None
    mine = (window, int(config.stride), int(config.n_kv_heads))
    rows = []
    for r in published.table("runs").itertuples():
        if r.kind != kind:
            continue
        run_w = None if kind == "full attention" else int(r.W)
        run_s = None if kind == "full attention" else int(r.S)
        key = _geometry_key(kind, mine, (run_w, run_s, int(r.kv_heads)))
        label, extra = VARIANTS[r.id]
        beyond = set(extra) - {"seed", "compression"} if isinstance(extra, dict) else {"inexpressible"}
        fold = common_fold((int(residues), stride), _geometry(pd.Series(r._asdict())))
        rows.append(dict(id=r.id, name=r.name, kind=r.kind, W=run_w, S=run_s, kv_heads=int(r.kv_heads),
                         geometry=_geometry_words(kind, run_w, run_s, int(r.kv_heads)), variant=label,
                         plain=not beyond, same_geometry=not any(key), key=key,
                         common_fold=fold[1] if fold else None))
    out = pd.DataFrame(rows)
    order = sorted(set(out.key))
    out["rank"] = out.key.map(order.index)
    out = out.sort_values("rank", kind="stable").drop(columns="key").reset_index(drop=True)
    for column in ("W", "S", "common_fold"):
        out[column] = out[column].astype("Int64")
    return out


# ------------------------------------------------------------------ folds
def common_fold(mine: tuple[int, int], theirs: tuple[int, int]) -> Optional[tuple[int, int]]:
    """``(modulus, fold)`` shared by two (residues R, stride S) pairs: the common residues gcd(R, R') and the
    fold lcm(S, S') (every phase of either model stays whole), or None when the fold does not divide
    the common residues."""
    modulus = math.gcd(mine[0], theirs[0])
    fold = mine[1] * theirs[1] // math.gcd(mine[1], theirs[1])
    return (modulus, fold) if modulus % fold == 0 else None


def _geometry(row: pd.Series) -> tuple[int, int]:
    modulus = 8 if row.kind == "DeepSeek" else 24
    stride = published.BASELINE_STRIDE if row.kind == "full attention" else int(row.S)
    return modulus, stride


def check_fold(residues: int, stride: int, run: str, *, what: str = "the model", kind: str = "profile") -> tuple[int, int]:
    """The ``(modulus, fold)`` that `compare` will use for a ``kind`` (``"profile"`` or ``"knockout"``)
    result with ``residues`` residues and phases mod ``stride`` beside the published ``run``, checked before
    the result exists (the command line runs it before the experiment): a pair with no common fold is one
    line naming the published runs that have one."""
    row = published._run_row(run)
    theirs = _geometry(row)
    shared = common_fold((int(residues), int(stride)), theirs)
    if shared is None:
        kinds = set(published.table("knockouts").run) if kind == "knockout" else None
        _refuse(what, (int(residues), int(stride)), str(row.id), theirs, kinds=kinds)
    return shared


def _refuse(what: str, mine: tuple[int, int], run_id: str, theirs: tuple[int, int], kinds=None) -> None:
    table = published.table("runs")
    ok = [r.id for r in table.itertuples() if (kinds is None or r.id in kinds)
          and common_fold(mine, _geometry(pd.Series(r._asdict()))) is not None]
    raise UserInputError(f"{what} (R={mine[0]}, S={mine[1]}) and {run_id} (R={theirs[0]}, S={theirs[1]}) have no common "
                         f"fold: lcm of the strides {mine[1] * theirs[1] // math.gcd(mine[1], theirs[1])} does not divide "
                         f"the common residues {math.gcd(mine[0], theirs[0])}; valid: {', '.join(ok) or 'none'}")


def refold(profile: PhaseProfile, modulus: int, stride: int) -> PhaseProfile:
    """``profile`` on ``modulus`` residues (each the mean of the residues congruent to it; ``modulus``
    divides the profile's) folded to ``stride`` phases. A measured profile is rebuilt from its records
    (its interval method kept); a published one by arithmetic: counts summed and Wilson intervals where
    counts exist, the published intervals where nothing changed, else NaN."""
    if modulus == profile.modulus and stride == profile.stride:
        return profile
    label = f"{profile.label} [R={modulus}, S={stride}]"
    rec = profile.records
    if len(rec) and {"residue", "correct"} <= set(rec.columns):
        method = profile.interval_method if profile.interval_method in ("wilson", "cluster_bootstrap") else "auto"
        return profile_from_records(rec.assign(residue=rec["residue"].to_numpy() % modulus), modulus, stride,
                                    label=label, confidence=profile.confidence, interval=method, axis=profile.axis)
    repeat = profile.modulus // modulus
    acc = profile.residue_accuracy.reshape(repeat, modulus).mean(0)
    k = profile.residue_correct.reshape(repeat, modulus).sum(0)
    n = profile.residue_n.reshape(repeat, modulus).sum(0)
    counted = bool((n > 0).all())
    if counted:
        lower, upper = stats.wilson_interval(k, n, profile.confidence)
    elif repeat == 1:
        lower, upper = profile.residue_lower, profile.residue_upper
    else:
        lower = upper = np.full(modulus, np.nan)
    phase_k = np.bincount(np.arange(modulus) % stride, weights=k, minlength=stride).astype(np.int64)
    phase_n = np.bincount(np.arange(modulus) % stride, weights=n, minlength=stride).astype(np.int64)
    if counted:
        phase_lower, phase_upper = stats.wilson_interval(phase_k, phase_n, profile.confidence)
    elif stride == profile.stride:
        phase_lower, phase_upper = profile.phase_lower, profile.phase_upper
    else:
        phase_lower = phase_upper = np.full(stride, np.nan)
    test = stats.detect_period(acc, seed=0) if modulus >= 4 else None
    return PhaseProfile(
        label=label, modulus=modulus, stride=stride, residue_correct=k.astype(np.int64), residue_n=n.astype(np.int64),
        residue_accuracy=acc, residue_lower=np.asarray(lower, float), residue_upper=np.asarray(upper, float),
        phase_correct=phase_k, phase_n=phase_n, phase_accuracy=stats.fold_residues(acc, stride),
        phase_lower=np.asarray(phase_lower, float), phase_upper=np.asarray(phase_upper, float),
        interval_method=profile.interval_method if not counted else "wilson", confidence=profile.confidence,
        period=test.period if test else None, best_period=test.best_period if test else None,
        period_p_value=test.p_value if test else float("nan"),
        period_attainable_p=test.min_attainable_p if test else float("nan"),
        homogeneity_p_value=stats.homogeneity_test(phase_k, phase_n).p_value if counted else float("nan"),
        records=rec.iloc[0:0].copy(), axis=profile.axis, source=profile.source,
    )


# ------------------------------------------------------------------ profiles
def _profile_row(own: PhaseProfile, folded: PhaseProfile, intervals: Optional[pd.Series]) -> dict:
    worst = folded.worst_phases[0]
    n = int(own.residue_n.min()) if own.residue_n.size else 0
    row = dict(
        model=own.label, source="published" if own.published else "measured", stride=own.stride,
        residues=own.modulus, n_per_residue=n if n > 0 else np.nan,
        mean_pct=100 * folded.mean, worst_phase=int(worst), worst_phase_pct=100 * float(folded.phase_accuracy[worst]),
        best_phase=int(folded.best_phase), best_phase_pct=100 * float(np.nanmax(folded.phase_accuracy)),
        phase_gap_pp=100 * folded.phase_gap, gap_pp=100 * folded.gap,
        worst_residue_pct=100 * float(np.nanmin(folded.residue_accuracy)),
        period=own.period if own.period is not None else np.nan, period_p_value=own.period_p_value,
        mean_pct_lower=np.nan, mean_pct_upper=np.nan, gap_pp_lower=np.nan, gap_pp_upper=np.nan,
    )
    if intervals is not None:  # the published mean / gap intervals hold for the published residues only
        for key in ("mean_pct_lower", "mean_pct_upper", "gap_pp_lower", "gap_pp_upper"):
            value = intervals.get(key.replace("_pct", "").replace("_pp", ""))
            row[key] = float(value) if value is not None and pd.notna(value) else np.nan
    return row


def _profiles(mine: PhaseProfile, run: str, padding: Optional[str]) -> PaperComparison:
    row = published._run_row(run)
    run_id = str(row.id)
    theirs = published.profile(run_id, padding)
    padding = theirs.source.split(", ")[1].split(" (")[0]
    shared = common_fold((mine.modulus, mine.stride), (theirs.modulus, theirs.stride))
    if shared is None:
        _refuse(f"{mine.label!r}", (mine.modulus, mine.stride), run_id, (theirs.modulus, theirs.stride))
    modulus, fold = shared
    a, b = refold(mine, modulus, fold), refold(theirs, modulus, fold)
    ev = published.evaluations()
    ev = ev[(ev.run == run_id) & (ev.padding == padding)].iloc[0]
    same = modulus == theirs.modulus
    table = pd.DataFrame([_profile_row(mine, a, None), _profile_row(theirs, b, ev if same else None)])
    detail = pd.concat([
        pd.DataFrame(dict(model=p.label, phase=np.arange(fold), accuracy_pct=100 * f.phase_accuracy,
                          lower_pct=100 * f.phase_lower, upper_pct=100 * f.phase_upper))
        for p, f in ((mine, a), (theirs, b))], ignore_index=True)
    notes = []
    for p in (mine, theirs):
        if p.stride != fold:
            notes.append(f"{p.label}: stride {p.stride} shown on {fold} phases (each of its phases {fold // p.stride} "
                         "times; none mixed)")
        if p.modulus != modulus:
            notes.append(f"{p.label}: {p.modulus} residues averaged to {modulus} (r, r + {modulus}, ...)")
    if not same:
        notes.append("the published mean and gap intervals hold for the published residues only: not shown")
    if not mine.published and mine.axis != "target":
        notes.append(f"{mine.label}: residues of the prompt length (axis {mine.axis!r}); the paper's are the target's")
    return PaperComparison(kind="profile", model_label=mine.label, run=run_id, padding=padding, fold=fold,
                           modulus=modulus, table=table, detail=detail, profiles=(a, b), notes=tuple(notes))


# ------------------------------------------------------------------ knockouts
def _phase_map(result: AblationResult, modulus: int, fold: int) -> np.ndarray:
    """``[unit, fold]``: relative change (%) per residue, averaged to ``modulus`` residues, then to ``fold``
    phases (the paper's fold: the mean of the residues' relative changes)."""
    residue = result.relative_change_residue.to_numpy(float)
    residue = residue.reshape(len(residue), -1, modulus).mean(1)
    return stats.fold_residues(residue, fold)


def _specialized(phase_map: np.ndarray) -> np.ndarray:
    """``[unit]``: True where the unit hurts (relative change <= `SPECIALIZED`) 1..3 adjacent phases and no other."""
    flags = np.zeros(len(phase_map), dtype=bool)
    for u, row in enumerate(phase_map):
        hurt = np.nan_to_num(row, nan=0.0) <= SPECIALIZED
        k = int(hurt.sum())
        if 1 <= k <= 3 and k < len(row):
            idx = set(np.flatnonzero(hurt).tolist())
            # adjacent on the circle: the k hurt phases fit in a window of k consecutive phases
            flags[u] = any(set((start + j) % len(row) for j in range(k)) == idx for start in range(len(row)))
    return flags


def _knockouts(mine: AblationResult, run: str, padding: Optional[str]) -> PaperComparison:
    theirs = published.knockout(run, padding)
    run_id = published.resolve(run)
    shared = common_fold((mine.residue_modulus, mine.stride), (theirs.residue_modulus, theirs.stride))
    if shared is None:
        have = list(dict.fromkeys(published.table("knockouts").run))
        _refuse(f"{mine.model_label!r}", (mine.residue_modulus, mine.stride), run_id,
                (theirs.residue_modulus, theirs.stride), kinds=set(have))
    modulus, fold = shared
    rows, detail = [], []
    for result in (mine, theirs):
        phase_map = _phase_map(result, modulus, fold)
        specialized = _specialized(phase_map)
        hurt = np.nan_to_num(phase_map, nan=0.0) <= SPECIALIZED
        count = int(specialized.sum())
        covered = sorted(set(np.flatnonzero(hurt[specialized].any(0)).tolist()))
        rows.append(dict(model=result.model_label, source="published" if result.published else "measured",
                         stride=result.stride, residues=result.residue_modulus, units=len(result.units),
                         specialized_units=count, specialized_share=count / max(len(result.units), 1),
                         phases_covered=len(covered), covered=", ".join(map(str, covered)) or "none",
                         worst_change_pct=float(np.nanmin(phase_map)),
                         median_unit_worst_pct=float(np.nanmedian(np.nanmin(phase_map, axis=1)))))
        for u, unit in enumerate(result.units.itertuples()):
            for g in range(fold):
                detail.append(dict(model=result.model_label, layer=int(unit.layer), kv_head=int(unit.kv_head), phase=g,
                                   relative_change=float(phase_map[u, g]), hurt=bool(hurt[u, g]),
                                   specialized=bool(specialized[u])))
    notes = [f"a unit is specialized when its knockout costs >= {-SPECIALIZED:.0f}% of the accuracy on 1..3 adjacent "
             "phases and no other (threshold alone on both sides: the published map has no prompts to test)"]
    return PaperComparison(kind="knockout", model_label=mine.model_label, run=run_id,
                           padding=theirs.model_label.split("(paper, ")[-1].rstrip(")"), fold=fold, modulus=modulus,
                           table=pd.DataFrame(rows), detail=pd.DataFrame(detail), notes=tuple(notes))


# ------------------------------------------------------------------ cycling
def _cycling_rows(label: str, source: str, stride: int, per_shift: pd.DataFrame, scored) -> tuple[dict, list]:
    ps = per_shift.set_index("shift").loc[list(scored)]
    row = dict(model=label, source=source, stride=stride, shifts=", ".join(f"{d:+d}" for d in scored),
               paper_r2_min=float(ps.corr2.min()), paper_r2_median=float(ps.corr2.median()),
               paper_r2_max=float(ps.corr2.max()), r2_min=float(ps.r2.min()), r2_max=float(ps.r2.max()),
               identified=f"{int(ps.identified.sum())}/{len(ps)}", points_per_shift=stride - 1)
    detail = [dict(model=label, shift=int(d), paper_r2=float(ps.loc[d, "corr2"]),
                   paper_r2_all=float(ps.loc[d, "corr2_all"]), paper_r2_interior=float(ps.loc[d, "corr2_interior"]),
                   r2=float(ps.loc[d, "r2"])) for d in scored]
    return row, detail


def _cycling(mine, run: str) -> PaperComparison:
    theirs = published.cycling(run)
    if isinstance(mine, PaperCycling):
        scored, label, source = [d for d in mine.shifts if d], mine.model_label, "published"
    else:
        scored, label, source = list(mine.scored_shifts), mine.model_label, "measured"
    if not scored:
        raise UserInputError(f"{label!r} has no scored gate shift (every shift is 0 mod S): nothing to compare")
    a, da = _cycling_rows(label, source, mine.stride, mine.scores["per_shift"], scored)
    b, db = _cycling_rows(theirs.model_label, "published", theirs.stride, theirs.scores["per_shift"],
                          [d for d in theirs.shifts if d])
    notes = ["paper_r2: squared correlation of observed against predicted accuracy change per shift, without the "
             "last phase (S - 1 points), computed here on both from their per-phase accuracies; r2: the toolkit's "
             "stricter 1 - SS_res/SS_tot (no fitted line)"]
    if mine.stride != theirs.stride:
        notes.append(f"strides differ ({mine.stride} vs {theirs.stride}): each score rests on S - 1 points, "
                     f"{mine.stride - 1} vs {theirs.stride - 1}")
    return PaperComparison(kind="cycling", model_label=label, run=theirs.run, padding="prefix",
                           fold=math.lcm(mine.stride, theirs.stride), modulus=0, table=pd.DataFrame([a, b]),
                           detail=pd.DataFrame(da + db), notes=tuple(notes))
