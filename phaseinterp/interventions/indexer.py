"""Phase through the Lightning Indexer: does top-k entry selection itself have a period?

For every prompt and CSA layer of a wrapped DeepSeek-V4 (`phaseinterp.from_hf`), at the answer position:
which compressed entries the indexer keeps (``hook_selected``) and how it ranks them (``hook_scores``).
CSA entry ``j`` covers positions ``(j-1)S .. jS+S-1``, so position ``v`` is in entries ``v // S`` and
``v // S + 1`` when closed. Per prompt and layer: ``value_selected`` (an entry holding the answer's
value token at ``target_pos + key_tokens`` is kept), ``key_selected`` (the key at ``target_pos``),
``pair_selected`` (one kept entry holds both), ``value_rank`` (0 = the best entry holding the value is
the top entry; -1 when none is closed) and ``value_margin`` (its score minus the k-th best: >= 0 inside
the top k). Aggregated by ``target_pos mod S`` with Wilson intervals and a chi-square homogeneity test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union, no_type_check

import numpy as np
import pandas as pd
import torch

from phaseinterp._checks import (DEFAULT_N_PER_RESIDUE, Spec, check_fraction, check_indices, check_int, check_seed, check_is_model, check_layer,
                                 check_n_per_residue, check_name, check_prompt_batch, experiment)
from phaseinterp.errors import UserInputError, applies_only, when_given
from phaseinterp import stats
from phaseinterp.results import Result, premise_entries
from phaseinterp.tasks import resolve_task
from phaseinterp.interventions._common import fixed_answer_position, model_device
from phaseinterp.models.protocol import phase_model
from phaseinterp.models.protocol import model_label as label_of

CSA = "compressed_sparse_attention"
RATES = ("value_selected", "key_selected", "pair_selected")


@dataclass(frozen=True, eq=False, repr=False)
class IndexerPhaseResult(Result):
    """Per (prompt, CSA layer) indexer outcomes at the answer position (``records``), by target phase.

    Each phase's rate rests on that phase's prompts (``n`` in `to_frame`); the homogeneity p-value tests
    the ``stride`` phase rates against one common rate."""

    records: pd.DataFrame
    stride: int
    residue_modulus: int
    top_k: int
    model_label: str = ""
    confidence: float = 0.95

    @property
    def layers(self) -> list[int]:
        return sorted(int(layer) for layer in self.records.layer.unique())

    def to_frame(self, level: str = "phase", metric: str = "value_selected") -> pd.DataFrame:
        """One row per (layer, phase|residue): ``n``, the ``metric`` rate with its Wilson interval,
        the other rates, the mean rank of the value's entry and the mean number of closed entries."""
        check_name("level", level, ("phase", "residue"))
        check_name("metric", metric, RATES)
        g = self.records.groupby(["layer", level])
        frame = g.agg(n=(metric, "size"), k=(metric, "sum"), **{f"{m}_rate": (m, "mean") for m in RATES},
                      mean_value_rank=("value_rank", "mean"), mean_closed=("n_closed", "mean")).reset_index()
        lo, hi = stats.wilson_interval(frame.k.to_numpy(), frame.n.to_numpy(), self.confidence)
        frame.insert(4, "rate", frame.k / frame.n)
        frame.insert(5, "lower", lo)
        frame.insert(6, "upper", hi)
        frame["metric"] = metric
        return frame.drop(columns="k")

    def rate_at(self, k: int) -> pd.DataFrame:
        """Value-entry selection rate by (layer, phase) had the indexer kept its top ``k`` (from the ranks;
        ties count as kept, so at the model's own k this can exceed ``value_selected``)."""
        k = check_int("k", k, 1)
        hit = self.records.assign(hit=(self.records.value_rank >= 0) & (self.records.value_rank < k))
        return hit.groupby(["layer", "phase"]).hit.mean().unstack("phase")

    def to_dict(self, metric: str = "value_selected") -> dict[str, Any]:
        """Per CSA layer: the ``metric`` rate by phase, the worst phase, the gap, the homogeneity p-value."""
        frame = self.to_frame("phase", metric)
        per_layer = {}
        for layer, sub in frame.groupby("layer"):
            sub = sub.sort_values("phase")
            k = (sub.rate * sub.n).round().to_numpy().astype(int)
            test = stats.homogeneity_test(k, sub.n.to_numpy())
            per_layer[int(layer)] = {
                "rate_by_phase": [round(float(r), 4) for r in sub.rate],
                "worst_phase": int(sub.phase.iloc[int(np.argmin(sub.rate.to_numpy()))]),
                "gap": float(sub.rate.max() - sub.rate.min()),
                "homogeneity_p_value": float(test.p_value),
                "mean_value_rank": float(sub.mean_value_rank.mean()),
            }
        return {"model": self.model_label, "metric": metric, "top_k": self.top_k, "stride": self.stride,
                "n_prompts": int(self.records.prompt.nunique()), "layers": per_layer}

    def plot(self, metric: str = "value_selected") -> Any:
        """Selection rate by target phase, one line per CSA layer, with Wilson intervals."""
        import plotly.graph_objects as go

        frame = self.to_frame("phase", metric)
        fig = go.Figure()
        for layer, sub in frame.groupby("layer"):
            fig.add_trace(go.Scatter(
                x=sub.phase, y=sub.rate, mode="lines+markers", name=f"layer {layer}",
                error_y=dict(type="data", symmetric=False, array=sub.upper - sub.rate, arrayminus=sub.rate - sub.lower)))
        fig.update_layout(title=f"Indexer keeps the target's entry ({metric}, top-{self.top_k}) — {self.model_label}",
                          xaxis_title=f"target phase (position mod {self.stride})", yaxis_title="selection rate",
                          yaxis_range=[0, 1.02], template="plotly_white")
        return fig


def _holding(position: np.ndarray, S: int, n_closed: np.ndarray) -> np.ndarray:
    """``[prompt, 2]`` entries holding ``position`` (newer half, older half); -1 where not closed."""
    j = np.stack([position // S, position // S + 1], 1)
    return np.where(j < n_closed[:, None], j, -1)


@no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
@dataclass(frozen=True)
class IndexerSpec(Spec):
    """`indexer_phase`'s and `force_target_selection`'s options, checked when made; their meanings are
    `indexer_phase`'s parameters."""

    layers: Union[int, Sequence[int], None] = None
    n_per_residue: int = DEFAULT_N_PER_RESIDUE
    seed: int = 0
    batch_size: int = 32
    confidence: float = 0.95

    def validate(self) -> None:
        if self.layers is not None:  # their range needs the model (csa_layers)
            self._set("layers", tuple(check_indices("layers", self.layers, 0, unit="layer")))
        check_n_per_residue(self.n_per_residue)
        check_seed("seed", self.seed)
        check_int("batch_size", self.batch_size, 1)
        check_fraction("confidence", self.confidence)

    def csa_layers(self, model, what: str = "indexer_phase") -> list[int]:
        """The checked CSA layers (default: every one), from ``model.cfg`` alone."""
        cfg = model.cfg
        csa = [layer for layer, kind in enumerate(getattr(cfg, "layer_types", ())) if kind == CSA]
        if not csa:
            raise UserInputError(f"{what}: the model has no indexer (no CSA layer); it needs a DeepSeek-V4 with CSA "
                                 "layers (phaseinterp.from_hf / load_hf)")
        if self.layers is None:
            return csa
        for layer in self.layers:
            check_layer(layer, cfg.n_layers)
            if layer not in csa:
                raise UserInputError(f"layer={layer!r} is not a CSA layer (CSA layers: {csa})")
        return list(self.layers)

    def check_model(self, model) -> None:
        """A DeepSeek-V4 with CSA layers; ``layers`` among them."""
        self.csa_layers(model)

    def check_task(self, task) -> None:
        check_n_per_residue(self.n_per_residue, getattr(task, "residue_modulus", None))


def _setup(model, task, spec: IndexerSpec, prompts, what: str):
    """Checked CSA layers (default: every CSA layer), the task, its prompts, the shared answer
    position, the CSA rate S and the task's key length. Every option is checked here, before
    any prompt is generated or any forward runs."""
    check_is_model(model)
    layers = spec.csa_layers(model, what)
    task = resolve_task(model, task)
    if prompts is None:
        spec.check_task(task)
        batch = task.generate(spec.n_per_residue, seed=spec.seed)
    elif not all(hasattr(prompts, a) for a in ("tokens", "answer_pos", "answer", "meta")):
        raise UserInputError(f"prompts={type(prompts).__name__} is not a prompt batch (task.generate(n_per_residue))")
    else:
        check_prompt_batch(prompts)
        spec.refuse_changed(("n_per_residue",), "prompts= gives the prompts, so their count is fixed")
        batch = prompts
    return (layers, task, batch, fixed_answer_position(batch), phase_model(model).layer_stride(layers[0]),
            int(getattr(task, "key_tokens", 1)))


@torch.inference_mode()  # prompts generated here and every forward: no autograd (the prompts are inference tensors)
@applies_only(("n_per_residue",), unless=when_given("prompts", "prompts= gives the prompts, so their count is fixed"))
@experiment(IndexerSpec)
def indexer_phase(model, task=None, *, layers: Optional[Sequence[int]] = None, n_per_residue: int = DEFAULT_N_PER_RESIDUE,
                  seed: int = 0, batch_size: int = 32, prompts=None, confidence: float = 0.95,
                  spec: Optional[IndexerSpec] = None) -> IndexerPhaseResult:
    """How often each CSA layer's indexer keeps the entry holding the target, by target phase.

    ``model``: a wrapped DeepSeek-V4 (`phaseinterp.from_hf`) with CSA layers; ``task`` defaults to
    the model's stored task; ``layers`` defaults to every CSA layer. Prompts must share one answer
    position. See the module docstring for the outcome columns.
    """
    batch_size, confidence = spec.batch_size, spec.confidence
    layers, task, batch, answer_pos, S, key_tokens = _setup(model, task, spec, prompts, "indexer_phase")
    family = phase_model(model)
    names = [family.indexer_hook(layer, h) for layer in layers for h in ("hook_scores", "hook_selected")]
    device = model_device(model)
    scores = {layer: [] for layer in layers}
    selected = {layer: [] for layer in layers}
    for i in range(0, batch.tokens.shape[0], batch_size):
        chunk = batch.tokens[i : i + batch_size, : answer_pos + 1].to(device)
        _, cache = model.run_with_cache(chunk, names_filter=names, return_type=None, return_cache_object=False)
        for layer in layers:
            scores[layer].append(cache[family.indexer_hook(layer, "hook_scores")][:, answer_pos].float().cpu())
            selected[layer].append(cache[family.indexer_hook(layer, "hook_selected")][:, answer_pos].cpu())
    meta = batch.meta.reset_index(drop=True)
    target = meta["target_pos"].to_numpy().astype(np.int64)
    value = target + key_tokens
    n = len(meta)
    n_closed = np.full(n, (answer_pos + 1) // S)
    top_k = 0
    frames = []
    for layer in layers:
        sc = torch.cat(scores[layer]).numpy()  # [prompt, entry]
        sel = torch.cat(selected[layer]).numpy()  # [prompt, k]
        top_k = max(top_k, sel.shape[1])
        chosen = np.zeros(sc.shape, dtype=bool)
        rows = np.repeat(np.arange(n), sel.shape[1])
        keep = sel.reshape(-1) >= 0
        chosen[rows[keep], sel.reshape(-1)[keep]] = True
        hold_v, hold_k = _holding(value, S, n_closed), _holding(target, S, n_closed)

        def any_chosen(hold, chosen=chosen):
            return np.array([any(j >= 0 and chosen[p, j] for j in hold[p]) for p in range(n)])

        pair = np.array([any(j >= 0 and chosen[p, j] and j in hold_k[p] for j in hold_v[p]) for p in range(n)])
        finite = np.where(np.isfinite(sc), sc, -np.inf)
        best = np.array([max((finite[p, j] for j in hold_v[p] if j >= 0), default=np.nan) for p in range(n)])
        rank = np.array([int((finite[p] > best[p]).sum()) if np.isfinite(best[p]) else -1 for p in range(n)])
        kth = -np.sort(-finite, axis=1)[:, min(sel.shape[1], finite.shape[1]) - 1] if finite.shape[1] else np.full(n, np.nan)
        frames.append(pd.DataFrame({
            "prompt": np.arange(n), "layer": layer, "residue": meta["residue"].to_numpy(),
            "phase": target % S, "target_pos": target, "value_pos": value,
            "value_selected": any_chosen(hold_v), "key_selected": any_chosen(hold_k), "pair_selected": pair,
            "value_rank": rank, "value_margin": best - kth, "n_closed": n_closed,
        }))
    return IndexerPhaseResult(records=pd.concat(frames, ignore_index=True), stride=S,
                              residue_modulus=int(batch.residue_modulus), top_k=int(top_k),
                              model_label=label_of(model), confidence=confidence)


@dataclass(frozen=True, eq=False, repr=False)
class ForcedSelectionResult(Result):
    """Accuracy with the indexer as it is (``clean_correct``) and with its selection at the answer
    position forced to include every closed entry holding the target's value (``forced_correct``), per
    prompt (``records``); the forced entries replace the lowest-ranked selected ones (top-k unchanged)."""

    records: pd.DataFrame
    stride: int
    layers: tuple[int, ...]
    top_k: int
    model_label: str = ""
    confidence: float = 0.95

    @property
    def premise_notes(self) -> tuple[str, ...]:
        """The premises of the causal test that fail: the indexer missed the target's entry for
        some prompt (else forcing changes nothing and the test has nothing to measure), and the
        clean accuracy has a phase gap for forcing to close (best minus worst phase beyond 3
        standard errors)."""
        notes = list(super().premise_notes)
        if not self.records["changed"].any():
            notes.append("the indexer already kept every entry holding the target's value for every prompt: forcing "
                         "changed no selection, so this measures nothing about selection misses")
        frame = self.to_frame()
        gap = stats.phase_gap_note(frame.clean_accuracy.to_numpy(), frame.n.to_numpy(), "the clean accuracy")
        return tuple(notes + ([gap] if gap else []))

    def to_frame(self) -> pd.DataFrame:
        """Per phase: ``n``, clean and forced accuracy with Wilson intervals, the change (pp), and the
        share of prompts whose indexer kept no entry holding the value in some forced layer
        (``missed``; ``changed`` marks prompts where any holding entry was added)."""
        rows = []
        for phase, sub in self.records.groupby("phase"):
            n = len(sub)
            row = {"phase": int(phase), "n": n, "missed_share": float(sub.missed.mean())}
            for col in ("clean", "forced"):
                k = int(sub[f"{col}_correct"].sum())
                lo, hi = stats.wilson_interval(np.array([k]), np.array([n]), self.confidence)
                row.update({f"{col}_accuracy": k / n, f"{col}_lower": float(lo[0]), f"{col}_upper": float(hi[0])})
            row["change_pp"] = 100 * (row["forced_accuracy"] - row["clean_accuracy"])
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        """Clean and forced accuracy by phase, their best-minus-worst gaps, and ``premise`` /
        ``premise_notes``."""
        frame = self.to_frame()
        return {"model": self.model_label, "layers": list(self.layers), "top_k": self.top_k,
                "n_prompts": int(len(self.records)),
                "clean_by_phase": [round(float(x), 4) for x in frame.clean_accuracy],
                "forced_by_phase": [round(float(x), 4) for x in frame.forced_accuracy],
                "clean_gap": float(frame.clean_accuracy.max() - frame.clean_accuracy.min()),
                "forced_gap": float(frame.forced_accuracy.max() - frame.forced_accuracy.min()),
                **premise_entries(self.premise_notes)}

    def plot(self) -> Any:
        import plotly.graph_objects as go

        frame = self.to_frame()
        fig = go.Figure()
        for col, name in (("clean", "indexer as trained"), ("forced", "target's entry forced in")):
            fig.add_trace(go.Scatter(x=frame.phase, y=frame[f"{col}_accuracy"], mode="lines+markers", name=name,
                                     error_y=dict(type="data", symmetric=False,
                                                  array=frame[f"{col}_upper"] - frame[f"{col}_accuracy"],
                                                  arrayminus=frame[f"{col}_accuracy"] - frame[f"{col}_lower"])))
        fig.update_layout(title=f"Forcing the target's entry into top-{self.top_k} (layers {list(self.layers)}) "
                                f"— {self.model_label}", xaxis_title=f"target phase (mod {self.stride})",
                          yaxis_title="top-1 accuracy", yaxis_range=[0, 1.02], template="plotly_white")
        return fig


@torch.inference_mode()
@applies_only(("n_per_residue",), unless=when_given("prompts", "prompts= gives the prompts, so their count is fixed"))
@experiment(IndexerSpec)
def force_target_selection(model, task=None, *, layers: Optional[Sequence[int]] = None, n_per_residue: int = DEFAULT_N_PER_RESIDUE,
                           seed: int = 0, batch_size: int = 32, prompts=None,
                           confidence: float = 0.95, spec: Optional[IndexerSpec] = None) -> ForcedSelectionResult:
    """Causal test of selection misses: accuracy by phase when each of ``layers``' indexers (default:
    every CSA layer) must keep the closed entries holding the target's value at the answer position."""
    batch_size, confidence = spec.batch_size, spec.confidence
    layers, task, batch, answer_pos, S, key_tokens = _setup(model, task, spec, prompts, "force_target_selection")
    meta = batch.meta.reset_index(drop=True)
    target = meta["target_pos"].to_numpy().astype(np.int64)
    n_closed = np.full(len(meta), (answer_pos + 1) // S)
    holding = _holding(target + key_tokens, S, n_closed)  # [prompt, 2]
    device = model_device(model)
    answers = torch.as_tensor(batch.answer)
    clean, forced = [], []
    missed, changed = np.zeros(len(meta), dtype=bool), np.zeros(len(meta), dtype=bool)

    for i in range(0, batch.tokens.shape[0], batch_size):
        chunk = batch.tokens[i : i + batch_size, : answer_pos + 1].to(device)
        need = holding[i : i + chunk.shape[0]]

        def force(sel, hook, need=need, start=i):
            sel = sel.clone()
            for b in range(sel.shape[0]):
                row = sel[b, answer_pos]
                have = row.tolist()
                holding_b = [int(j) for j in need[b] if j >= 0]
                want = [j for j in holding_b if j not in have][: len(row)]
                if holding_b and len(want) == len(holding_b):
                    missed[start + b] = True
                if want:
                    changed[start + b] = True
                    row[len(row) - len(want):] = torch.tensor(want, dtype=row.dtype, device=row.device)
            return sel

        clean.append(model(chunk)[:, answer_pos].argmax(-1).cpu())
        hooks = [(phase_model(model).indexer_hook(layer, "hook_selected"), force) for layer in layers]
        forced.append(model.run_with_hooks(chunk, fwd_hooks=hooks)[:, answer_pos].argmax(-1).cpu())
    records = pd.DataFrame({
        "prompt": np.arange(len(meta)), "residue": meta["residue"].to_numpy(), "phase": target % S,
        "target_pos": target, "clean_correct": (torch.cat(clean) == answers).numpy(),
        "forced_correct": (torch.cat(forced) == answers).numpy(), "missed": missed, "changed": changed,
    })
    return ForcedSelectionResult(records=records, stride=S, layers=tuple(layers), top_k=int(model.cfg.index_topk),
                                 model_label=label_of(model), confidence=confidence)


__all__ = ["ForcedSelectionResult", "IndexerPhaseResult", "IndexerSpec", "force_target_selection", "indexer_phase"]
