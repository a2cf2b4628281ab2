"""Result objects of `phaseinterp.paper`: published gate profiles, published gate cycling with the
toolkit's scores on it, and a comparison of any result with a published run. Each follows the shared
protocol of `phaseinterp.results.Result` (``summary``, ``to_frame``, ``plot``, ``save``/``load``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from phaseinterp.interventions.cycling_stats import cycling_scores
from phaseinterp.results import Result, plotting


@dataclass(frozen=True, eq=False, repr=False)
class PaperGates(Result):
    """Published gate profiles beside the prefix-padding knockout folded to phases (`phaseinterp.paper.gates`).

    ``gates``: one row per (layer, kv_head, phase) with ``key_gate`` and ``value_gate`` (gate mass over its
    uniform share; the value gate rolled by -1 as published, aligned with the key at r) and ``knockout``
    (relative change, %). ``highlight``: the layers the paper shows."""

    run: str
    model_label: str
    window: int
    stride: int
    kv_heads: int
    layers: int
    mode: str
    tied: bool
    gates: pd.DataFrame
    highlight: tuple[int, ...] = ()
    source: str = ""

    def key_gate(self) -> np.ndarray:
        """``[layer, kv_head, phase]`` key-gate profile."""
        return self._array("key_gate")

    def _array(self, column: str) -> np.ndarray:
        g = self.gates.sort_values(["layer", "kv_head", "phase"])
        return g[column].to_numpy(float).reshape(self.layers, self.kv_heads, self.stride)

    def alignment(self) -> pd.DataFrame:
        """Per (layer, kv_head): the key gate's preferred phase, the phase its knockout hurts most, the
        harm there (relative change, %), and the correlation across the S phases of the key gate with
        the harm (``-knockout`` clipped at 0; S points each; NaN without harm)."""
        kg, ko = self._array("key_gate"), self._array("knockout")
        rows = []
        for layer in range(self.layers):
            for h in range(self.kv_heads):
                harm = np.clip(-ko[layer, h], 0, None)
                corr = float(np.corrcoef(kg[layer, h], harm)[0, 1]) if harm.std() > 0 and kg[layer, h].std() > 0 \
                    else float("nan")
                rows.append(dict(layer=layer, kv_head=h, preferred_phase=int(kg[layer, h].argmax()),
                                 peak_gate=float(kg[layer, h].max()), most_hurt_phase=int(ko[layer, h].argmin()),
                                 worst_knockout=float(ko[layer, h].min()), correlation=corr))
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, kv_head, phase): ``key_gate``, ``value_gate``, ``knockout`` (%)."""
        return self.gates.copy()

    def to_dict(self) -> dict:
        """Headline numbers: the run, its geometry and gates, and for the heads whose knockout costs at least
        half of some phase's accuracy (``worst_knockout <= -50``) how often the key gate's preferred
        phase is the most hurt phase, and the median gate-harm correlation."""
        a = self.alignment()
        strong = a[a.worst_knockout <= -50]
        return {"run": self.run, "model": self.model_label, "window": self.window, "stride": self.stride,
                "kv_heads": self.kv_heads, "layers": self.layers, "gates": self.mode, "tied_kv": self.tied,
                "heads_with_knockout_below_-50%": int(len(strong)),
                "preferred_phase_is_most_hurt": int((strong.preferred_phase == strong.most_hurt_phase).sum()),
                "median_gate_harm_correlation": float(np.nanmedian(a.correlation)) if a.correlation.notna().any()
                else float("nan"),
                "source": self.source}

    def plot(self, **kwargs):
        return plotting().paper.gates_figure(self, **kwargs)


@dataclass(frozen=True, eq=False, repr=False)
class PaperCycling(Result):
    """A published gate-cycling run (`phaseinterp.paper.cycling`) with the toolkit's scores on it.

    ``profiles``: one row per (shift, phase): ``observed`` with ``lower``/``upper``, ``predicted``
    ``A_0((r - d) mod S)`` (fractions), ``predicted_change`` / ``observed_change`` (pp) and ``boundary``;
    shift 0 is unshifted. ``published``: the paper's ``r2x`` (squared correlation without phase S - 1),
    ``r2i``, ``r2a``, ``maeA`` / ``maeI``, ``dAcc`` and ``accPct`` per shift with intervals. ``scores``:
    `cycling_scores` on the published profiles (its ``corr2``, ``corr2_all``, ``corr2_interior`` are
    ``r2x``, ``r2a``, ``r2i``; ``r2`` is the toolkit's stricter score)."""

    run: str
    model_label: str
    stride: int
    kv_heads: int
    profiles: pd.DataFrame
    published: pd.DataFrame
    source: str = ""

    @property
    def shifts(self) -> tuple[int, ...]:
        """The applied shifts (0 first)."""
        return tuple(int(d) for d in sorted(set(self.profiles["shift"]), key=lambda d: (d != 0, d)))

    def phase_accuracy(self) -> pd.DataFrame:
        """Observed accuracy per shift (rows) x phase (columns), fractions."""
        frame = self.profiles.pivot(index="shift", columns="phase", values="observed").loc[list(self.shifts)]
        frame.columns.name = "phase"
        return frame

    @functools.cached_property
    def scores(self) -> dict:
        """`cycling_scores` of the published profiles (fractions): ``per_shift`` and the pooled scores."""
        acc = self.phase_accuracy()
        return cycling_scores(acc.loc[0].to_numpy(), {d: acc.loc[d].to_numpy() for d in self.shifts if d})

    def to_frame(self) -> pd.DataFrame:
        """One row per shift: the paper's R² (``paper_r2`` = ``r2x``, with its interval; ``paper_r2_all`` =
        ``r2a``; ``paper_r2_interior`` = ``r2i``) beside the toolkit's ``corr2``, ``corr2_all``,
        ``corr2_interior`` (the same statistics, computed here), the toolkit's stricter ``r2`` family
        (no fitted line), the fitted slope, MAE (pp: the paper's over all and interior phases, the
        toolkit's over the non-boundary ones), the mean accuracy change and the displacement estimate."""
        ps = self.scores["per_shift"].set_index("shift")
        pub = self.published.set_index("shift")
        rows = []
        for d in self.shifts:
            if d == 0:
                continue
            s, p = ps.loc[d], pub.loc[d]
            rows.append(dict(
                shift=d, paper_r2=p.r2x, paper_r2_lower=p.r2x_lower, paper_r2_upper=p.r2x_upper, corr2=s.corr2,
                paper_r2_all=p.r2a, corr2_all=s.corr2_all, paper_r2_interior=p.r2i, corr2_interior=s.corr2_interior,
                r2=s.r2, r2_all=s.r2_all, r2_interior=s.r2_interior, slope=s.slope,
                paper_mae_all_pp=p.maeA, paper_mae_interior_pp=p.maeI, mae_pp=100 * s.mae,
                paper_accuracy_change_pp=p.dAcc, mean_drop_pp=100 * s.mean_drop,
                displacement=int(s.displacement), identified=bool(s.identified), boundary_rank=int(s.boundary_rank),
            ))
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """Headline numbers: the paper's R² over the shifts, the toolkit's same statistic and the largest
        difference between them, the toolkit's stricter R², shifts identified."""
        t = self.to_frame()
        diff = np.abs(np.r_[t.corr2 - t.paper_r2, t.corr2_all - t.paper_r2_all,
                            t.corr2_interior - t.paper_r2_interior])
        return {"run": self.run, "model": self.model_label, "stride": self.stride, "shifts": list(t["shift"]),
                "paper_r2_min": float(t.paper_r2.min()), "paper_r2_max": float(t.paper_r2.max()),
                "corr2_min": float(t.corr2.min()), "corr2_max": float(t.corr2.max()),
                "max_abs_difference_paper_vs_toolkit": float(np.nanmax(diff)),
                "r2_strict_min": float(t.r2.min()), "r2_strict_max": float(t.r2.max()),
                "r2_pooled": float(self.scores["r2_pooled"]), "corr2_pooled": float(self.scores["corr2_pooled"]),
                "n_identified": int(self.scores["n_identified"]), "n_shifts": int(self.scores["n_shifts"]),
                "source": self.source}

    def plot(self, **kwargs):
        return plotting().paper.cycling_figure(self, **kwargs)


@dataclass(frozen=True, eq=False, repr=False)
class PaperComparison(Result):
    """A result beside a published run in the same statistic (`phaseinterp.paper.compare`).

    ``kind``: ``"profile"``, ``"knockout"`` or ``"cycling"``. ``table``: one row per model (yours first),
    computed the same way for both; profiles are folded to ``fold`` phases (the lcm of the two strides) on
    ``modulus`` common residues: ``mean_pct``, ``worst_phase`` / ``worst_phase_pct``, ``best_phase_pct``,
    ``phase_gap_pp``, ``gap_pp`` and ``period``. ``profiles``: the two re-folded profiles. ``notes``: what
    the reader should know."""

    kind: str
    model_label: str
    run: str
    padding: str
    fold: int
    modulus: int
    table: pd.DataFrame
    detail: pd.DataFrame
    profiles: tuple = ()
    notes: tuple[str, ...] = ()

    def to_frame(self) -> pd.DataFrame:
        """The comparison table: one row per model."""
        return self.table.copy()

    def to_dict(self) -> dict:
        """The two models, the common fold, and each statistic of the table side by side."""
        out = {"kind": self.kind, "model": self.model_label, "paper_run": self.run, "padding": self.padding,
               "fold": self.fold, "modulus": self.modulus}
        if len(self.table) == 2:
            yours, theirs = self.table.iloc[0], self.table.iloc[1]
            for column in self.table.columns:
                if column in ("model", "source"):
                    continue
                out[column] = [_plain(yours[column]), _plain(theirs[column])]
        out["notes"] = list(self.notes)
        return out

    def plot(self, **kwargs):
        return plotting().paper.comparison_figure(self, **kwargs)


def _plain(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value
