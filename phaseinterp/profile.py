"""The phase profile: top-1 retrieval accuracy by target residue and phase, with intervals
(docs/science.md, "Evaluation protocol")."""

import inspect
from dataclasses import dataclass
from typing import Any, no_type_check

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from phaseinterp.errors import UserInputError, applies_only
from phaseinterp import stats
from phaseinterp.models.protocol import eval_mode, phase_model
from phaseinterp._checks import (DEFAULT_N_PER_RESIDUE, INTERVALS, ProfileOptions, check_device, check_every_residue, check_fraction,
                                 check_int, check_n_per_residue, check_prompt_batch, check_seed, env_flag, experiment)
from phaseinterp.phase import check_residue_modulus
from phaseinterp.results import Result, plotting
from phaseinterp.tasks import resolve_task
from phaseinterp.tasks.length_axis import check_axis, length_axis_batch



@dataclass(frozen=True, eq=False, repr=False)
class PhaseProfile(Result):
    """Accuracy per residue (mod R) and per phase (mod S) with intervals, plus the per-prompt records.

    Accuracies are fractions; gaps (``gap``, ``phase_gap``) are differences of fractions. Residue
    intervals are Wilson, or a cluster bootstrap over ``mapping_id`` when prompts share mappings
    (``interval_method``). Phase accuracy averages the R/S residues of the phase; its interval uses the
    pooled counts. ``period`` is the significant dominant period of the residue profile
    (`phaseinterp.stats.detect_period`; None when not significant at 0.05); ``homogeneity_p_value`` is the
    chi-square test that every phase has the same accuracy.

    ``axis``: ``"target"`` (residues of the target's position) or ``"length"`` (of the prompt's length,
    `phaseinterp.tasks.length_axis`). ``source`` is empty for a profile measured here; a published profile
    (`phaseinterp.paper.profile`) names its source, has no ``records``, zero counts where none are
    published (its intervals are the published ones) and a NaN ``homogeneity_p_value``."""

    label: str
    modulus: int
    stride: int
    residue_correct: Int[np.ndarray, " residue"]
    residue_n: Int[np.ndarray, " residue"]
    residue_accuracy: Float[np.ndarray, " residue"]
    residue_lower: Float[np.ndarray, " residue"]
    residue_upper: Float[np.ndarray, " residue"]
    phase_correct: Int[np.ndarray, " phase"]
    phase_n: Int[np.ndarray, " phase"]
    phase_accuracy: Float[np.ndarray, " phase"]
    phase_lower: Float[np.ndarray, " phase"]
    phase_upper: Float[np.ndarray, " phase"]
    interval_method: str
    confidence: float
    period: int | None
    best_period: int | None
    period_p_value: float
    homogeneity_p_value: float
    records: pd.DataFrame
    axis: str = "target"
    source: str = ""
    period_attainable_p: float = float("nan")

    def __post_init__(self) -> None:
        if len(self.residue_n) != self.modulus or len(self.phase_n) != self.stride:
            raise UserInputError(
                f"expected {self.modulus} residues and {self.stride} phases, got {len(self.residue_n)} and {len(self.phase_n)}"
            )

    # ------------------------------------------------------------ headline
    @property
    def published(self) -> bool:
        """True for published numbers (`phaseinterp.paper`): no per-prompt records behind them."""
        return bool(self.source)

    @property
    def mean(self) -> float:
        """Mean over residues (each residue weighted equally; equals pooled accuracy when balanced)."""
        return float(np.nanmean(self.residue_accuracy))

    @property
    def worst_residue(self) -> int:
        """The residue with the lowest accuracy (the first of ties)."""
        return int(np.nanargmin(self.residue_accuracy))

    @property
    def best_residue(self) -> int:
        """The residue with the highest accuracy (the first of ties)."""
        return int(np.nanargmax(self.residue_accuracy))

    @property
    def gap(self) -> float:
        """Best minus worst residue accuracy."""
        return stats.gap(self.residue_accuracy)

    @property
    def phase_gap(self) -> float:
        """Best minus worst phase accuracy."""
        return stats.gap(self.phase_accuracy)

    @property
    def worst_phases(self) -> tuple[int, ...]:
        """Every phase tied (to 1e-12) with the lowest phase accuracy."""
        low = np.nanmin(self.phase_accuracy)
        return tuple(int(s) for s in np.flatnonzero(self.phase_accuracy <= low + 1e-12))

    @property
    def best_phase(self) -> int:
        """The phase with the highest accuracy (the first of ties)."""
        return int(np.nanargmax(self.phase_accuracy))

    @property
    def period_undetermined(self) -> bool:
        """True when the period test could not reach significance at this design whatever the accuracies'
        arrangement (``period_attainable_p > 0.05``, e.g. 8 residues on the length axis): ``period`` None
        then says nothing about a period."""
        return self.period is None and bool(self.period_attainable_p > 0.05)

    @property
    def period_verdict(self) -> str:
        """The period test in words: ``"4 (p=0.0005)"``, ``"none (best 6, p=0.426)"`` or ``"undetermined at
        this design ..."`` with the best attainable p and what design would decide it."""
        return stats.PeriodTest(self.period, self.best_period, self.period_p_value, 0.0, {}, np.zeros(0), 0.05,
                                min_attainable_p=self.period_attainable_p).verdict(self.modulus)

    # -------------------------------------------------------------- frames
    def to_frame(self) -> pd.DataFrame:
        """One row per prompt: the task's metadata plus ``phase``, ``predicted``, ``correct``, ``answer_logprob``."""
        return self.records.copy()

    def residue_frame(self) -> pd.DataFrame:
        """One row per residue ``0..R-1``: its phase, prompt count, correct count, accuracy (fraction)
        and the interval bounds (``interval_method`` at ``confidence``)."""
        r = np.arange(self.modulus)
        return pd.DataFrame(dict(residue=r, phase=r % self.stride, n=self.residue_n, correct=self.residue_correct,
                                 accuracy=self.residue_accuracy, lower=self.residue_lower, upper=self.residue_upper))

    def phase_frame(self) -> pd.DataFrame:
        """One row per phase ``0..S-1``: pooled counts, accuracy (the mean of its R/S residues), interval
        bounds, and ``worst`` (tied for the lowest accuracy)."""
        s = np.arange(self.stride)
        return pd.DataFrame(dict(phase=s, n=self.phase_n, correct=self.phase_correct, accuracy=self.phase_accuracy,
                                 lower=self.phase_lower, upper=self.phase_upper, worst=np.isin(s, self.worst_phases)))

    def to_dict(self) -> dict[str, Any]:
        """Headline numbers, full precision (accuracies as fractions, gaps as fraction differences)."""
        return {
            "label": self.label,
            "axis": self.axis,
            "modulus": self.modulus,
            "stride": self.stride,
            "n_prompts": int(self.residue_n.sum()),
            "n_per_residue": int(self.residue_n.min()),
            "mean": self.mean,
            "worst_residue": self.worst_residue,
            "worst_residue_accuracy": float(self.residue_accuracy[self.worst_residue]),
            "best_residue": self.best_residue,
            "best_residue_accuracy": float(self.residue_accuracy[self.best_residue]),
            "gap": self.gap,
            "worst_phases": list(self.worst_phases),
            "worst_phase_accuracy": float(np.nanmin(self.phase_accuracy)),
            "best_phase": self.best_phase,
            "best_phase_accuracy": float(np.nanmax(self.phase_accuracy)),
            "worst_phase_interval": [float(self.phase_lower[self.worst_phases[0]]),
                                     float(self.phase_upper[self.worst_phases[0]])],
            "best_phase_interval": [float(self.phase_lower[self.best_phase]), float(self.phase_upper[self.best_phase])],
            "phase_gap": self.phase_gap,
            "period": self.period,
            "period_verdict": self.period_verdict,
            "best_period": self.best_period,
            "period_p_value": self.period_p_value,
            "period_attainable_p": self.period_attainable_p,
            "homogeneity_p_value": self.homogeneity_p_value,
            "interval_method": self.interval_method,
            "confidence": self.confidence,
        } | ({"source": self.source} if self.source else {})

    def plot(self) -> Any:
        """Plotly figure: accuracy vs residue with intervals, phases marked, and the folded phase profile."""
        return plotting().profile.plot_profile(self)


@dataclass(frozen=True, eq=False, repr=False)
class TwoAxisProfile(Result):
    """Accuracy by target phase x prompt-length phase (``phase_profile(..., axis="both")``).

    ``profiles`` holds the target-axis and the length-axis `PhaseProfile`; ``cell_correct`` / ``cell_n``
    count the prompts of each (target phase, length phase) cell."""

    label: str
    modulus: int
    stride: int
    cell_correct: Int[np.ndarray, "target_phase length_phase"]
    cell_n: Int[np.ndarray, "target_phase length_phase"]
    profiles: tuple

    @classmethod
    def from_profiles(cls, target: PhaseProfile, length: PhaseProfile) -> "TwoAxisProfile":
        S = target.stride
        rec = target.records
        t = rec["target_residue"].to_numpy() % S
        ell = rec["length_residue"].to_numpy() % S
        correct = rec["correct"].to_numpy().astype(np.int64)
        cell_n = np.zeros((S, S), dtype=np.int64)
        cell_k = np.zeros((S, S), dtype=np.int64)
        np.add.at(cell_n, (t, ell), 1)
        np.add.at(cell_k, (t, ell), correct)
        return cls(label=target.label, modulus=target.modulus, stride=S, cell_correct=cell_k, cell_n=cell_n,
                   profiles=(target, length))

    @property
    def target(self) -> PhaseProfile:
        return self.profiles[0]

    @property
    def length(self) -> PhaseProfile:
        return self.profiles[1]

    def table(self) -> pd.DataFrame:
        """Accuracy (fraction) per cell: rows the target's phase, columns the prompt length's phase."""
        with np.errstate(invalid="ignore", divide="ignore"):
            acc = self.cell_correct / self.cell_n
        frame = pd.DataFrame(acc, index=pd.RangeIndex(self.stride, name="target phase"),
                             columns=pd.RangeIndex(self.stride, name="length phase"))
        return frame

    def to_frame(self) -> pd.DataFrame:
        """One row per prompt (with ``target_residue``, ``length_residue``, ``prompt_len``)."""
        return self.target.to_frame()

    def to_dict(self) -> dict[str, Any]:
        """Both axes' headline numbers, prefixed ``target_`` and ``length_``."""
        keep = ("mean", "worst_phases", "worst_phase_accuracy", "best_phase", "best_phase_accuracy", "phase_gap",
                "period", "period_p_value", "homogeneity_p_value")
        out: dict[str, Any] = {"label": self.label, "modulus": self.modulus, "stride": self.stride,
                               "n_prompts": int(self.cell_n.sum())}
        for name, prof in (("target", self.target), ("length", self.length)):
            d = prof.to_dict()
            out.update({f"{name}_{k}": d[k] for k in keep})
        return out

    def plot(self) -> Any:
        """Plotly heatmap: target phase x prompt-length phase."""
        return plotting().profile.plot_two_axis(self)


def _logits(output: Any) -> torch.Tensor:
    # HF-style models return an object with .logits; the toolkit's models return the tensor.
    return output.logits if hasattr(output, "logits") else output


def _is_engine(model: Any) -> bool:
    """An engine (`phaseinterp.engines.Engine`: a callable returning next-token log-probs), not a model."""
    return not isinstance(model, torch.nn.Module) and callable(model)


@no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
class ProfileSpec(ProfileOptions):
    """`phase_profile`'s options (and `phaseinterp.engine_profile`'s), checked when made; their
    meanings are `phase_profile`'s parameters. ``stride=None`` means the model's own stride."""

    def validate(self) -> None:
        check_axis(self.axis)  # interval, seed, hold ...: their declarations (ProfileOptions) are checked
        check_n_per_residue(self.n_per_residue)
        check_int("n_permutations", self.n_permutations, 1, 1_000_000)  # bounded: numpy fails on a huge count
        check_int("n_bootstrap", self.n_bootstrap, 1, 1_000_000)
        check_fraction("confidence", self.confidence)
        if self.label is not None and not isinstance(self.label, str):
            raise UserInputError(f"label={self.label!r} must be a string")
        check_device(self.device)

    def stride_of(self, model: Any) -> int:
        """The stride the residues fold by: this spec's, else the model's own."""
        stride = self.stride if self.stride is not None else phase_model(model).stride
        if stride is None:
            raise UserInputError("the model has no cfg.stride; pass stride= explicitly")
        return stride

    def check_model(self, model: Any) -> None:
        """A stride to fold by: this spec's or ``model.cfg.stride``."""
        if self.stride is None and getattr(model.cfg, "stride", None) is None:
            raise UserInputError("the model has no cfg.stride; pass stride= explicitly")

    def check_task(self, task: Any, stride: int | None = None) -> None:
        """The task's residue modulus against the stride, and (a task that lays prompts out) the
        prompt count it can moment-match."""
        if hasattr(task, "generate"):
            R = task.residue_modulus
            if stride is not None:
                check_residue_modulus(R, stride)
            check_n_per_residue(self.n_per_residue, R)
            if self.axis != "target":
                check_int("hold", self.hold or 0, 0, R - 1)
        elif self.axis != "target":
            raise UserInputError(f"axis={self.axis!r} lays the task's prompts out at several lengths; a ready "
                                 "TaskBatch has one layout: pass the task (e.g. KeyValueRetrieval) instead")

    def prompts(self, task: Any, stride: int, tokenizer: Any = None) -> Any:
        """The prompts of ``task`` under this spec (``task.generate``, or on the length axis
        `length_axis_batch`), or ``task`` itself when it is a ready TaskBatch."""
        self.check_task(task, stride)
        if hasattr(task, "generate"):
            if self.axis != "target":
                return length_axis_batch(task, self.n_per_residue, seed=self.seed, stride=stride, axis=self.axis,
                                         hold=self.hold or 0, tokenizer=tokenizer, length_modulus=self.length_modulus)
            extra = {} if tokenizer is None else {"tokenizer": tokenizer}
            if tokenizer is not None and "tokenizer" not in inspect.signature(task.generate).parameters:
                raise UserInputError(f"tokenizer= does not apply to {type(task).__name__}: its prompts are laid out in "
                                     "its own vocabulary (a tokenizer lays out NeedleRetrieval's); drop tokenizer=")
            batch = task.generate(self.n_per_residue, seed=self.seed, **extra)
        else:
            if tokenizer is not None:
                raise UserInputError("tokenizer= lays out a task's prompts; this TaskBatch is laid out already")
            self.refuse_changed(("n_per_residue",), f"task= is a ready TaskBatch of {len(task)} prompts (pass the "
                                                    "task itself to choose a size)")
            batch = task
        if len(batch) == 0:
            raise UserInputError("the batch holds 0 prompts; generate at least one per residue")
        check_residue_modulus(batch.residue_modulus, stride)
        if batch is task:  # a generated batch holds every residue; a ready one may not
            check_prompt_batch(batch, "task")
        return batch

    def result(self, records: pd.DataFrame, modulus: int, stride: int, label: str) -> "PhaseProfile | TwoAxisProfile":
        """The profile of ``records`` on this spec's axis: a `PhaseProfile` (target, length) or a
        `TwoAxisProfile` (both)."""
        options = dict(label=label, confidence=self.confidence, interval=self.interval, n_bootstrap=self.n_bootstrap,
                       n_permutations=self.n_permutations, seed=self.seed)
        if self.axis != "both":
            return profile_from_records(records, modulus, stride, axis=self.axis, **options)
        target = profile_from_records(records, modulus, stride, axis="target", **options)
        by_length = records.assign(residue=records["length_residue"] % stride)
        length = profile_from_records(by_length, stride, stride, axis="length", **options)
        return TwoAxisProfile.from_profiles(target, length)


def _batch_given(arguments: dict) -> str | None:
    task = arguments.get("task")
    if task is not None and hasattr(task, "tokens") and not hasattr(task, "generate"):
        return f"task= is a ready TaskBatch of {len(task)} prompts (pass the task itself to choose a size)"
    return None


@applies_only(("n_per_residue",), unless=_batch_given)
@experiment(ProfileSpec)
def phase_profile(
    model: Any,
    task: Any = None,
    *,
    n_per_residue: int = DEFAULT_N_PER_RESIDUE,
    seed: int = 0,
    batch_size: int = 64,
    device: str | torch.device | None = None,
    stride: int | None = None,
    label: str | None = None,
    confidence: float = 0.95,
    interval: str = "auto",
    n_bootstrap: int = 2000,
    n_permutations: int = 1999,
    progress: bool = True,
    axis: str = "target",
    hold: int | None = None,
    length_modulus: int | None = None,
    tokenizer: Any = None,
    spec: ProfileSpec | None = None,
) -> "PhaseProfile | TwoAxisProfile":
    """Top-1 accuracy of ``model`` on ``task`` by the target's residue mod R and phase mod S.

    A prompt is correct when the argmax over the full vocabulary of the logits at ``answer_pos`` is
    ``answer`` (docs/science.md, "Evaluation protocol"). Steps: ``spec`` (`ProfileSpec`),
    `profile_records` (one row per prompt), ``spec.result(records)``.

    Parameters:
        model: an ``nn.Module`` mapping tokens ``[batch, pos]`` to logits ``[batch, pos, d_vocab]`` (or an
            object with ``.logits``), with a ``cfg`` holding ``d_vocab``, ``n_ctx`` and ``stride``. An
            engine is refused: `phaseinterp.engine_profile` profiles it.
        task: a task with ``generate(n_per_residue, seed)`` or a ready ``TaskBatch`` (default: the task
            stored with the model).
        n_per_residue: prompts per residue group (total ``n_per_residue * R``, at most ``MAX_PROMPTS``);
            a size the task cannot moment-match raises naming the nearest workable one. Refused beside
            a TaskBatch.
        seed: prompt seed; also seeds the bootstrap and the permutation test.
        batch_size: prompts per forward pass, >= 1.
        device: where the prompts go (default: the model's device).
        stride: fold residues to phases with this stride (default ``model.cfg.stride``); R must be a
            multiple of it.
        label: the profile's name (default ``model.cfg.label``).
        confidence: interval level in (0, 1).
        interval: ``"wilson"``, ``"cluster_bootstrap"`` (over ``meta.mapping_id``, ``n_bootstrap``
            replicates) or ``"auto"`` (bootstrap iff some mapping is shared by several prompts).
        n_permutations: permutations of the period test.
        progress: show a progress bar (also off when ``PHASEINTERP_NO_PROGRESS`` is set).
        axis: ``"target"`` (the target's residue varies), ``"length"`` (the prompt length's residue
            varies, the target held at residue ``hold``) or ``"both"`` (a `TwoAxisProfile`); off the
            target axis prompts are laid out shorter with filler after the head
            (`phaseinterp.tasks.length_axis`); a ready TaskBatch has no length axis.
        hold: the target residue mod R held fixed on the length axis.
        length_modulus: the length axis's modulus M, a multiple of S dividing R (default: R when the
            task allows, else the largest M it can).
        tokenizer: passed to ``task.generate(..., tokenizer=)``.
        spec: a ready `ProfileSpec` instead of the options above (not both).

    Returns a `PhaseProfile`. The model runs in eval mode under ``torch.inference_mode``; its training
    flag is restored afterwards."""
    if _is_engine(model):
        raise UserInputError(f"model={model!r:.80} is an engine (a callable, not an nn.Module): profile it with "
                             "phaseinterp.engine_profile(engine, task, stride=S), which journals and retries its "
                             "requests")
    task = resolve_task(model, task)
    if not (hasattr(task, "generate") or hasattr(task, "tokens")):
        raise UserInputError(
            f"task={task!r} is neither a task (with .generate, e.g. KeyValueRetrieval) nor a TaskBatch; "
            "see phaseinterp.zoo.task_for(model)"
        )
    family = phase_model(model)  # any nn.Module with a cfg: GenericModel
    stride = spec.stride_of(model)
    batch = spec.prompts(task, stride, tokenizer)
    records = profile_records(model, batch, spec, stride)
    label = spec.label if spec.label is not None else family.label
    own = family.stride
    if family.is_compressed and own is not None and stride != own:
        label += f" [re-folded by S={stride}; the model's own stride is {own}]"  # a deliberate choice, shown
    return spec.result(records, batch.residue_modulus, stride, label)


def profile_records(model: Any, batch: Any, spec: ProfileSpec, stride: int) -> pd.DataFrame:
    """One row per prompt of ``batch``: the task's metadata plus ``phase``, ``answer``, ``predicted``,
    ``correct``, ``answer_logprob`` (`records_frame`), from ``model`` run in eval mode under
    ``torch.inference_mode`` (its training flag restored afterwards)."""
    family = phase_model(model)
    cfg = family.cfg
    d_vocab, n_ctx = getattr(cfg, "d_vocab", None), getattr(cfg, "n_ctx", None)  # optional for GenericModel
    if n_ctx is not None and batch.seq_len > n_ctx:
        raise UserInputError(f"prompts have {batch.seq_len} tokens but the model's n_ctx is {n_ctx}")
    top = int(batch.tokens.max())
    if d_vocab is not None and top >= d_vocab:
        raise UserInputError(f"token id {top} is out of range for d_vocab={d_vocab} (0..{d_vocab - 1})")
    device = check_device(spec.device)
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")

    n, batch_size = len(batch), spec.batch_size
    predicted = torch.empty(n, dtype=torch.long)
    answer_logprob = torch.empty(n, dtype=torch.float32)
    # both families read the answer's logits without running their last layer at every position
    last_only = family.has_answer_logits
    with eval_mode(model), torch.inference_mode():
        starts = range(0, n, batch_size)
        quiet = not spec.progress or len(starts) < 2 or env_flag("PHASEINTERP_NO_PROGRESS")
        for start in tqdm(starts, desc="phase profile", disable=quiet):
            stop = min(start + batch_size, n)
            pos = batch.answer_pos[start:stop]
            if last_only and bool((pos == pos[0]).all()):  # one answer position: the last-position path
                last = family.answer_logits(batch.tokens[start:stop, : int(pos[0]) + 1].to(device)).float()
            else:
                logits = _logits(model(batch.tokens[start:stop].to(device)))
                if logits.ndim != 3 or logits.shape[:2] != (stop - start, batch.seq_len):
                    raise UserInputError(f"model returned logits of shape {tuple(logits.shape)}; "
                                         "expected [batch, pos, d_vocab]")
                last = logits[torch.arange(stop - start, device=logits.device), pos.to(logits.device)].float()
            rows = torch.arange(stop - start, device=last.device)
            predicted[start:stop] = last.argmax(dim=-1).cpu()
            answer = batch.answer[start:stop].to(last.device)
            answer_logprob[start:stop] = torch.log_softmax(last, dim=-1)[rows, answer].cpu()
    return records_frame(batch, stride, predicted.numpy(), answer_logprob.numpy())


def records_frame(batch: Any, stride: int, predicted: np.ndarray, answer_logprob: np.ndarray) -> pd.DataFrame:
    """One row per prompt: the task's metadata plus ``phase``, ``answer``, ``predicted``, ``correct``,
    ``answer_logprob``."""
    R = batch.residue_modulus
    records = batch.meta.copy()
    residues = records["residue"].to_numpy()
    if residues.min() < 0 or residues.max() >= R:
        raise UserInputError(f"meta.residue must lie in 0..{R - 1}")
    records["phase"] = residues % stride
    records["answer"] = batch.answer.numpy()
    records["predicted"] = predicted
    records["correct"] = records["predicted"] == records["answer"]
    records["answer_logprob"] = answer_logprob
    return records


def check_resampling(n_bootstrap: Any, n_permutations: Any, seed: Any) -> None:
    """The resampling options of a profile made from records, before any record is read."""
    check_int("n_bootstrap", n_bootstrap, 1, why=" (bootstrap replicates)")
    check_int("n_permutations", n_permutations, 1, why=" (permutations of the period test)")
    check_seed("seed", seed)


def profile_from_records(
    records: pd.DataFrame,
    modulus: int,
    stride: int,
    *,
    label: str = "",
    confidence: float = 0.95,
    interval: str = "auto",
    n_bootstrap: int = 2000,
    n_permutations: int = 1999,
    seed: int = 0,
    axis: str = "target",
) -> PhaseProfile:
    """Aggregate per-prompt records (columns ``residue``, ``correct``; ``mapping_id`` optional) into a profile
    whose residues are those of ``axis`` ("target" or "length")."""
    if axis not in ("target", "length"):
        raise UserInputError(f"axis={axis!r}: a PhaseProfile's residues are of 'target' or 'length'")
    if interval not in INTERVALS:
        raise UserInputError(f"interval={interval!r} is not one of {INTERVALS}")
    check_resampling(n_bootstrap, n_permutations, seed)
    check_residue_modulus(modulus, stride)
    residues = records["residue"].to_numpy().astype(np.int64)
    check_every_residue(residues, modulus, "the records")
    correct = records["correct"].to_numpy().astype(bool)
    phases = residues % stride
    residue_n = np.bincount(residues, minlength=modulus)
    residue_k = np.bincount(residues, weights=correct, minlength=modulus).astype(np.int64)
    phase_n = np.bincount(phases, minlength=stride)
    phase_k = np.bincount(phases, weights=correct, minlength=stride).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        residue_acc = residue_k / residue_n
    phase_acc = stats.fold_residues(residue_acc, stride)

    # A phase's accuracy is the mean of its residues' (the paper's fold). Where its residues hold unequal
    # numbers of prompts that is not the pooled share, so its interval weighs each prompt 1 / (its
    # residue's prompts): the cluster bootstrap's weighted mean, Wilson's at the effective sample size.
    per_phase = [n[n > 0] for n in (residue_n[s::stride] for s in range(stride))]
    unequal = any(n.size and np.ptp(n) > 0 for n in per_phase)
    shared = "mapping_id" in records and records["mapping_id"].duplicated().any()
    method = ("cluster_bootstrap" if shared else "wilson") if interval == "auto" else interval
    if method == "cluster_bootstrap":
        if "mapping_id" not in records:
            raise UserInputError("interval='cluster_bootstrap' needs a mapping_id column in the records")
        clusters = records["mapping_id"].to_numpy()
        by_residue = stats.cluster_bootstrap(
            correct, clusters, residues, modulus, n_replicates=n_bootstrap, confidence=confidence, seed=seed
        )
        by_phase = stats.cluster_bootstrap(
            correct, clusters, phases, stride, n_replicates=n_bootstrap, confidence=confidence, seed=seed,
            weights=1.0 / residue_n[residues] if unequal else None,
        )
        residue_lo, residue_hi = by_residue.lower, by_residue.upper
        phase_lo, phase_hi = by_phase.lower, by_phase.upper
    else:
        residue_lo, residue_hi = stats.wilson_interval(residue_k, residue_n, confidence)
        if unequal:  # Kish's effective size of the phase's residue mean: m^2 / sum(1 / n_r) over its m residues
            n_eff = np.array([n.size**2 / np.sum(1.0 / n) if n.size else 0.0 for n in per_phase])
            phase_lo, phase_hi = stats.wilson_interval(np.nan_to_num(phase_acc) * n_eff, n_eff, confidence)
        else:
            phase_lo, phase_hi = stats.wilson_interval(phase_k, phase_n, confidence)

    if (residue_n > 0).all():
        test = stats.detect_period(residue_acc, n_permutations=n_permutations, seed=seed)
        period, best_period, p_period, p_floor = test.period, test.best_period, test.p_value, test.min_attainable_p
    else:  # a residue without prompts: no profile to test
        period, best_period, p_period, p_floor = None, None, float("nan"), float("nan")
    return PhaseProfile(
        label=label,
        modulus=modulus,
        stride=stride,
        residue_correct=residue_k,
        residue_n=residue_n.astype(np.int64),
        residue_accuracy=residue_acc.astype(np.float64),
        residue_lower=np.asarray(residue_lo, dtype=np.float64),
        residue_upper=np.asarray(residue_hi, dtype=np.float64),
        phase_correct=phase_k,
        phase_n=phase_n.astype(np.int64),
        phase_accuracy=np.asarray(phase_acc, dtype=np.float64),
        phase_lower=np.asarray(phase_lo, dtype=np.float64),
        phase_upper=np.asarray(phase_hi, dtype=np.float64),
        interval_method=method,
        confidence=confidence,
        period=period,
        best_period=best_period,
        period_p_value=p_period,
        period_attainable_p=p_floor,
        homogeneity_p_value=stats.homogeneity_test(phase_k, phase_n).p_value,
        records=records.reset_index(drop=True),
        axis=axis,
    )
