"""`conformance`: the same phase-controlled prompts through the reference forward and through
incremental decoding, chunked prefill, a warm prefix cache, lower precision or an external engine,
compared per phase of the answer position (and of the prefill cut or the warm shared prefix).
Each prompt is presented at every answer phase by deleting its last ``d`` filler tokens, so the
reference and every engine see the very same sequences."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence, no_type_check

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from phaseinterp.errors import UserInputError
from phaseinterp import stats
from phaseinterp._checks import check_fraction, check_indices, check_int, check_is_model, check_n_per_residue, check_real, env_flag
from phaseinterp.engines.adapters import cast_copy, chunked_pieces, decode_pieces, engine_for
from phaseinterp.engines.adapters import WarmEngine
from phaseinterp.engines.answers import check_logprobs
from phaseinterp.engines.result import ConformanceResult
from phaseinterp.models.protocol import phase_model
from phaseinterp.models.paths import refuse_hooks
from phaseinterp._checks import CONFORMANCE_MODES as MODES
from phaseinterp._checks import DEFAULT_CONFORMANCE_MODES as DEFAULT_MODES
from phaseinterp._checks import DTYPES, ConformanceOptions, experiment

# The verdict per phase: a statistic of |difference of next-token log-probs| against a tolerance. float32
# engines only reorder sums, so the max (one prompt beyond 1e-3 is a fault); low precision: the mean, within
# 32 units of the dtype's roundoff. Override per setting: ``tolerance={"bfloat16": ("max", 1.0), "decode": 1e-4}``.
DEFAULT_TOLERANCE = {"decode": ("max", 1e-3), "chunked_prefill": ("max", 1e-3), "warm": ("max", 1e-3),
                     "bfloat16": ("mean", 32 * 2.0**-8), "float16": ("mean", 32 * 2.0**-11)}
STATISTICS = ("max", "mean")
ENGINE_TOLERANCE = ("max", 1e-3)  # default for an external engine


def cut_period(model: Any) -> int:
    """The period of the prefill cut phases: the stride for phaseinterp's own models; for
    DeepSeek-V4 the least common multiple of its layers' compress rates (CSA and HCA: 32 for
    rates 4 and 32), so every cut phase of both compressors is visited."""
    cfg = model.cfg
    rates = getattr(cfg, "compress_rates", None)
    if rates and getattr(cfg, "layer_types", None):
        present = [int(rates[k]) for k in set(cfg.layer_types) if k in rates]
        if present:
            return math.lcm(*present)
    return int(cfg.stride)


def answer_phase_variants(tokens: Int[Tensor, "batch pos"], filler_ids: Sequence[int], stride: int,
                          phases: Sequence[int]) -> dict[int, tuple[Tensor, np.ndarray]]:
    """For each answer phase ``a``: the prompts with their last ``d`` filler tokens deleted, where
    ``d`` in ``0..stride-1`` puts the last position ``T - 1 - d`` at phase ``a``; and ``removed``
    ``[batch, d]``, the deleted positions (to shift each prompt's metadata)."""
    T = tokens.shape[1]
    is_filler = torch.isin(tokens, torch.as_tensor(list(filler_ids), dtype=tokens.dtype))
    n_fillers = is_filler.sum(1)
    out = {}
    for a in phases:
        d = (T - 1 - a) % stride
        if d and int(n_fillers.min()) < d:
            raise UserInputError(f"answer phase {a} needs {d} filler tokens per prompt to delete, but a prompt "
                             f"has {int(n_fillers.min())}")
        keep = torch.ones_like(tokens, dtype=torch.bool)
        removed = np.zeros((tokens.shape[0], d), dtype=np.int64)
        if d:
            positions = torch.arange(T).expand_as(tokens)
            last = torch.where(is_filler, positions, -1).topk(d, dim=1).values  # the d last filler positions
            keep.scatter_(1, last, False)
            removed = last.numpy()
        out[a] = (tokens[keep].reshape(tokens.shape[0], T - d), removed)
    return out


def default_prefix_lengths(length: int, period: int) -> tuple[int, ...]:
    """One shared-prefix length per phase of ``period``: ``L = B + c`` for ``c`` in ``0..period-1``,
    ``B`` the multiple of ``period`` nearest the middle of a ``length``-token prompt (at least
    ``period``), so every ``L mod period`` is visited and ``L = B`` sits on a boundary of every
    compressor whose rate divides ``period`` (DeepSeek-V4's HCA included)."""
    base = period * max(1, (length - 1) // 2 // period)
    if base + period - 1 > length - 1:
        raise UserInputError(f"prompts of {length} tokens are too short for shared-prefix lengths {base}.."
                             f"{base + period - 1} (one per phase of the cut period {period}): give "
                             f"prefix_lengths= in 1..{length - 1}")
    return tuple(range(base, base + period))


def donor_prompts(tokens: Int[Tensor, "batch pos"], prefix_len: int,
                  filler_ids: Sequence[int]) -> Int[Tensor, "batch pos"]:
    """Donors for the warm mode: each row equal to ``tokens``'s row on the first ``prefix_len``
    tokens, then the next row's tail (rows rolled by one), with the token at ``prefix_len``
    replaced where it would still agree, so the shared prefix is exactly ``prefix_len`` long."""
    donors = tokens.clone()
    donors[:, prefix_len:] = tokens.roll(1, 0)[:, prefix_len:]
    first = int(filler_ids[0])
    second = next((int(f) for f in filler_ids if int(f) != first), first - 1 if first > 0 else first + 1)
    same = donors[:, prefix_len] == tokens[:, prefix_len]
    other = torch.where(tokens[:, prefix_len] == first, second, first)
    donors[:, prefix_len] = torch.where(same, other, donors[:, prefix_len])
    return donors


def _check_phases(name: str, phases: Any, period: int) -> tuple[int, ...]:
    if phases is None:
        return tuple(range(period))
    return tuple(check_indices(name, phases, 0, period - 1, unit="phase"))


def _names(name: str, value: Any, options: tuple) -> tuple:
    """``value`` (one of ``options``, or a list or tuple of distinct ones) as a tuple; a `UserInputError`
    naming ``name`` else."""
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(v, str) for v in names):
        raise UserInputError(f"{name}={value!r} must be a list of names from {options}")
    for one in names:
        if one not in options:
            raise UserInputError(f"{name}={value!r}: {name[:-1]} {one!r} is not one of {options}")
    if len(set(names)) != len(names):
        raise UserInputError(f"{name}={tuple(names)} repeats a {name[:-1]}")
    return tuple(names)


@no_type_check  # validate() checks each option and names it; a runtime type checker would preempt it
class ConformanceSpec(ConformanceOptions):
    """`conformance`'s options, checked when made; their meanings are its parameters. Modes and dtypes
    are kept as tuples."""

    def validate(self) -> None:
        modes, dtypes = _names("modes", self.modes, MODES), _names("dtypes", self.dtypes, DTYPES)
        if "dtype" in modes and not dtypes:
            raise UserInputError(f"mode 'dtype' needs dtypes from {DTYPES}")
        self._set("modes", modes)
        self._set("dtypes", dtypes)
        if self.tolerance is not None and not isinstance(self.tolerance, Mapping):
            raise UserInputError(f"tolerance={self.tolerance!r} must be a dict {{setting: bound or (statistic, bound)}}")
        for key, value in dict(self.tolerance or {}).items():
            _tolerance_entry(key, value, "max")
        check_n_per_residue(self.n_per_residue)  # seed, chunk, batch_size: their declarations (ConformanceOptions)
        check_int("n_bootstrap", self.n_bootstrap, 1, 1_000_000)  # bounded: a huge count would run without end
        check_fraction("confidence", self.confidence)
        if self.label is not None and not isinstance(self.label, str):
            raise UserInputError(f"label={self.label!r} must be a string")

    def check_model(self, model) -> None:
        """Answer phases in ``0..S-1``, cut phases in ``0..P-1`` and ``chunk`` a multiple of the cut
        period ``P`` (`cut_period`, from ``model.cfg``)."""
        _check_phases("answer_phases", self.answer_phases, int(model.cfg.stride))
        period = cut_period(model)
        _check_phases("cut_phases", self.cut_phases, period)
        if self.chunk is not None:
            check_int("chunk", self.chunk, period)
            if self.chunk % period:
                raise UserInputError(f"chunk={self.chunk} must be a multiple of the cut period {period}")

    def check_task(self, task) -> None:
        if not hasattr(task, "generate") or not hasattr(getattr(task, "vocab", None), "filler_ids"):
            raise UserInputError(f"task={task!r} must be a retrieval task with generate() and vocab.filler_ids "
                                 "(phaseinterp.zoo.task_for(model))")
        check_n_per_residue(self.n_per_residue, getattr(task, "residue_modulus", 1))


def _tolerance_entry(key: str, value: Any, statistic: str) -> tuple[str, float]:
    """A tolerance given as ``bound`` (with the setting's default ``statistic``) or ``(statistic, bound)``."""
    statistic, bound = value if isinstance(value, tuple) and len(value) == 2 else (statistic, value)
    if statistic not in STATISTICS:
        raise UserInputError(f"tolerance[{key!r}]: statistic {statistic!r} is not one of {STATISTICS}")
    return statistic, check_real(f"tolerance[{key!r}]", bound, 0.0, low_open=True)


@experiment(ConformanceSpec)
def conformance(
    model: Any,
    task: Any,
    modes: Sequence[str] = DEFAULT_MODES,
    *,
    n_per_residue: int = 8,
    seed: int = 0,
    answer_phases: Optional[Sequence[int]] = None,
    cut_phases: Optional[Sequence[int]] = None,
    chunk: Optional[int] = None,
    dtypes: Sequence[str] = DTYPES,
    tolerance: Optional[Mapping[str, Any]] = None,
    engines: Optional[Mapping[str, Any]] = None,
    prefix_lengths: Optional[Sequence[int]] = None,
    warm_engines: Optional[Mapping[str, Any]] = None,
    reference: Optional[Any] = None,
    batch_size: int = 256,
    confidence: float = 0.95,
    n_bootstrap: int = 2000,
    label: Optional[str] = None,
    progress: bool = True,
    spec: Optional[ConformanceSpec] = None,
) -> ConformanceResult:
    """Compare next-token log-probs at the answer position of every engine with the reference,
    per answer phase (``answer_pos mod S``) and, for chunked prefill, per cut phase; for a warm
    cache, per phase of the shared-prefix length.

    Parameters:
        model: a `CompressedTransformer` (own cache) or a `HookedDeepseekV4` (transformers' cache);
            engines run on the model's device.
        task: a retrieval task with ``generate`` and ``vocab.filler_ids``.
        modes: any of ``"decode"`` (token by token), ``"chunked_prefill"`` (pieces cut at one phase,
            `chunked_pieces`), ``"warm"`` (from the cache of a donor sharing the first ``L`` tokens, each
            ``L`` of ``prefix_lengths``), ``"dtype"`` (the model cast to each of ``dtypes``); default
            `DEFAULT_MODES`. May be empty when ``engines`` or ``warm_engines`` is given.
        n_per_residue: prompts per target residue, each at every answer phase (moments best-effort).
        answer_phases / cut_phases: the phases to test (default all); chunk: tokens per prefill piece
            after the first (a multiple of `cut_period`; default the smallest >= 2 local windows).
        dtypes: from ``("bfloat16", "float16")``; one the device cannot run is in ``result.skipped``.
        tolerance: ``{setting: bound}`` or ``{setting: (statistic, bound)}`` overriding
            `DEFAULT_TOLERANCE` (statistic ``"max"`` or ``"mean"`` |d log p|).
        engines: extra `Engine` callables by name, compared like a mode.
        prefix_lengths: the warm settings' ``L`` (each in ``1..T-1``); default `default_prefix_lengths`.
        warm_engines: `WarmEngine` s by name, each answering right after its donor
            (``engine.warm(donors, tokens, L)``); one without ``warm`` is refused.
        reference: the reference engine (default: the model's full forward in float32).
        confidence / n_bootstrap: Wilson intervals of agreement; paired bootstrap of the accuracy difference.
        spec: a ready `ConformanceSpec` instead of the options above (not both).

    Returns a `ConformanceResult`: ``table`` (one row per setting x phase) and ``records``
    (``prefix_len``: the warm rows' ``L``, -1 elsewhere)."""
    check_is_model(model)
    refuse_hooks(model, "conformance")
    for argument, given in (("engines", engines), ("warm_engines", warm_engines)):
        if given is not None and not isinstance(given, Mapping):
            raise UserInputError(f"{argument}={type(given).__name__} must be a dict {{name: engine}}")
        for name, engine in dict(given or {}).items():
            if not isinstance(name, str) or not name or name in MODES or name in DTYPES:
                raise UserInputError(f"engine name {name!r} must be a non-empty string other than {MODES + DTYPES}")
            if not callable(engine):
                raise UserInputError(f"{argument}[{name!r}] is a {type(engine).__name__}, not a callable engine")
    if reference is not None and not callable(reference):
        raise UserInputError(f"reference is a {type(reference).__name__}, not a callable engine (default: the "
                             "model's full forward)")
    engines, warm_engines = dict(engines or {}), dict(warm_engines or {})
    for name, engine in warm_engines.items():
        if name in engines:
            raise UserInputError(f"engine name {name!r} is in both engines and warm_engines: name them apart "
                                 f"(e.g. {name + ':warm'!r})")
        if not isinstance(engine, WarmEngine):
            raise UserInputError(f"warm_engines[{name!r}]: a {type(engine).__name__} cannot reuse a cached prefix (it "
                                 "has no warm(donors, tokens, prefix_len)); CacheEngine, TransformersEngine, "
                                 "LlamaCppEngine and OpenAIEngine can")
    if not modes and not engines and not warm_engines:
        raise UserInputError(f"nothing to check: give modes from {MODES}, engines or warm_engines")
    is_warm = "warm" in modes or bool(warm_engines)
    if prefix_lengths is not None and not is_warm:
        raise UserInputError(f"prefix_lengths={prefix_lengths!r} is for the warm mode: add 'warm' to modes or give "
                             "warm_engines")
    settings = ([m for m in modes if m != "dtype"] + (list(dtypes) if "dtype" in modes else []) + list(engines)
                + list(warm_engines))
    tol = {s: DEFAULT_TOLERANCE.get(s, ENGINE_TOLERANCE) for s in settings}
    for key, value in dict(tolerance or {}).items():
        if key not in tol:
            raise UserInputError(f"tolerance for {key!r}: not a setting of this check (settings: {settings})")
        tol[key] = _tolerance_entry(key, value, tol[key][0])
    spec.check_task(task)
    spec.check_model(model)
    ref_engine = reference if reference is not None else engine_for(model)  # ValueError for other families
    cfg = model.cfg
    stride, period = int(cfg.stride), cut_period(model)
    answer_phases = _check_phases("answer_phases", answer_phases, stride)
    cut_phases = _check_phases("cut_phases", cut_phases, period)
    if chunk is None:
        chunk = period * max(1, math.ceil(2 * int(getattr(cfg, "local_window", period)) / period))
    if getattr(task, "seq_len", 0) > getattr(cfg, "n_ctx", math.inf):
        raise UserInputError(f"the task's prompts have {task.seq_len} tokens but the model's n_ctx is {cfg.n_ctx}")

    batch = task.generate(n_per_residue, seed=seed, strict=False)
    variants = answer_phase_variants(batch.tokens, task.vocab.filler_ids, stride, answer_phases)
    shortest = min(t.shape[1] for t, _ in variants.values())
    if is_warm:
        prefix_lengths = (default_prefix_lengths(shortest, period) if prefix_lengths is None
                          else tuple(check_indices("prefix_lengths", prefix_lengths, 1, shortest - 1, unit="length",
                                                   why=f" (shared-prefix lengths for the shortest prompt of {shortest} "
                                                   "tokens)")))
    runs, skipped = _runs(model, modes, dtypes, cut_phases, period, chunk, engines, warm_engines, shortest,
                          batch.tokens[:1])
    records = conformance_records(ref_engine, runs, batch, variants, task.vocab.filler_ids, prefix_lengths, period,
                                  batch_size, progress)
    table = phase_table(records, tol, confidence=confidence, n_bootstrap=n_bootstrap, seed=seed)
    return ConformanceResult(
        label=label or phase_model(model).label,
        stride=stride, cut_period=period, chunk=int(chunk), modes=modes, settings=tuple(settings),
        tolerance=tol, skipped=skipped, n_prompts=len(batch), seq_len=int(batch.seq_len), seed=seed,
        confidence=confidence, table=table, records=records,
    )


def _runs(model, modes, dtypes, cut_phases, period: int, chunk: int, engines: dict, warm_engines: dict, shortest: int,
          probe: Tensor) -> tuple[list[tuple[str, str, int, Any]], dict[str, str]]:
    """What `conformance` compares with the reference: ``(mode, setting, cut phase or -1, engine)`` per run,
    and the dtypes the device cannot run (``{dtype: reason}``)."""
    runs: list[tuple[str, str, int, Any]] = []
    skipped: dict[str, str] = {}
    if "decode" in modes:
        runs.append(("decode", "decode", -1, engine_for(model, decode_pieces, "decode")))
    if "chunked_prefill" in modes:
        for c in cut_phases:
            schedule = lambda n, c=c: chunked_pieces(n, c, period, chunk)  # noqa: E731
            schedule(shortest)  # too-short prompts raise here
            runs.append(("chunked_prefill", "chunked_prefill", c, engine_for(model, schedule, f"chunked@{c}")))
    if "dtype" in modes:
        for dt in dtypes:
            engine, reason = _dtype_engine(model, getattr(torch, dt), probe)
            if engine is None:
                skipped[dt] = reason
                continue
            runs.append(("dtype", dt, -1, engine))
    runs += [("engine", name, -1, engine) for name, engine in engines.items()]
    if "warm" in modes:
        runs.append(("warm", "warm", -1, engine_for(model, None, "warm")))
    runs += [("warm", name, -1, engine) for name, engine in warm_engines.items()]
    return runs, skipped


def conformance_records(reference, runs, batch, variants: dict, filler_ids, prefix_lengths, period: int,
                        batch_size: int, progress: bool) -> pd.DataFrame:
    """One row per prompt, answer phase and run of ``runs`` (`_records`): each engine's next-token
    log-probs at the answer position against ``reference``'s on the same sequences; a warm run answers
    each prompt after a donor sharing its first ``L`` tokens, for each ``L`` of ``prefix_lengths``."""
    quiet = not progress or env_flag("PHASEINTERP_NO_PROGRESS")
    reference_logprobs = {a: _run(reference, tokens, batch_size) for a, (tokens, _) in variants.items()}
    frames = []
    for mode, setting, cut, engine in tqdm(runs, desc="conformance", disable=quiet):
        if mode == "warm":
            for length in prefix_lengths:
                for a, (tokens, removed) in variants.items():
                    donors = donor_prompts(tokens, length, filler_ids)
                    logprobs = _run(engine, tokens, batch_size, donors, length)
                    frames.append(_records(batch, removed, tokens.shape[1], a, mode, setting, length % period,
                                           reference_logprobs[a], logprobs, prefix_len=length))
            continue
        for a, (tokens, removed) in variants.items():
            logprobs = _run(engine, tokens, batch_size)
            frames.append(_records(batch, removed, tokens.shape[1], a, mode, setting, cut,
                                   reference_logprobs[a], logprobs))
    return pd.concat(frames, ignore_index=True) if frames else _records_empty()


def _dtype_engine(model: torch.nn.Module, dtype: torch.dtype, probe: Tensor):
    """The model cast to ``dtype`` as an engine, or ``(None, reason)`` when the device cannot run it."""
    try:
        cast = cast_copy(model, dtype)
        engine = engine_for(cast, None, str(dtype).replace("torch.", ""))
        engine(probe)
    except (RuntimeError, TypeError, NotImplementedError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return None, f"{dtype} does not run on {next(model.parameters()).device}: {first}"
    return engine, ""


def _run(engine: Any, tokens: Tensor, batch_size: int, donors: Optional[Tensor] = None,
         prefix_len: int = 0) -> Float[Tensor, "batch d_vocab"]:
    """``engine(tokens)`` in batches, or ``engine.warm(donors, tokens, prefix_len)`` with ``donors``."""
    parts = []
    for start in range(0, tokens.shape[0], batch_size):
        chunk = tokens[start:start + batch_size]
        out = engine(chunk) if donors is None else engine.warm(donors[start:start + batch_size], chunk, prefix_len)
        parts.append(check_logprobs(out, chunk.shape[0], getattr(engine, "name", engine)))
    return torch.cat(parts)


def _records(batch, removed: np.ndarray, length: int, answer_phase: int, mode: str, setting: str, cut: int,
             ref: Float[Tensor, "batch d_vocab"], out: Float[Tensor, "batch d_vocab"],
             prefix_len: int = -1) -> pd.DataFrame:
    """One row per prompt: |d log p| over the entries the engine reports, top-1s, correctness."""
    if out.shape != ref.shape:
        raise UserInputError(f"engine {setting!r} returned {out.shape[1]} log-probs per prompt; the reference has "
                         f"{ref.shape[1]}")
    reported = ~torch.isnan(out)
    diff = torch.where(reported, (out - ref).abs(), torch.zeros_like(ref))
    n_reported = reported.sum(1)
    top1 = torch.where(reported, out, torch.full_like(out, -math.inf)).argmax(1)
    ref_top1 = ref.argmax(1)
    answer = batch.answer
    target = batch.meta["target_pos"].to_numpy()
    shift = (removed < target[:, None]).sum(1) if removed.size else 0
    return pd.DataFrame({
        "mode": mode, "setting": setting, "cut_phase": cut, "prefix_len": prefix_len, "answer_phase": answer_phase,
        "answer_pos": length - 1, "prompt": np.arange(len(answer)), "residue": batch.meta["residue"].to_numpy(),
        "target_pos": target - shift, "answer": answer.numpy(), "ref_top1": ref_top1.numpy(),
        "top1": top1.numpy(), "agree": (top1 == ref_top1).numpy(),
        "ref_correct": (ref_top1 == answer).numpy(), "correct": (top1 == answer).numpy(),
        "max_abs_diff": diff.amax(1).numpy(),
        "mean_abs_diff": (diff.sum(1) / n_reported.clamp(min=1)).numpy(),
        "n_reported": n_reported.numpy(),
    })


def _records_empty() -> pd.DataFrame:
    return pd.DataFrame(columns=["mode", "setting", "cut_phase", "prefix_len", "answer_phase", "answer_pos", "prompt", "residue",
                                 "target_pos", "answer", "ref_top1", "top1", "agree", "ref_correct", "correct",
                                 "max_abs_diff", "mean_abs_diff", "n_reported"])


def phase_table(records: pd.DataFrame, tolerance: Mapping[str, tuple[str, float]], *, confidence: float = 0.95,
                n_bootstrap: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per setting and phase (``kind`` "answer": ``answer_pos mod S``; "cut": the prefill cut's or warm
    prefix's length mod the cut period, pooled over answer phases): ``n``, ``max_abs_diff`` and
    ``mean_abs_diff`` of next-token log-probs, top-1 ``agreement`` (Wilson), reference and engine
    accuracy, ``accuracy_diff`` (paired bootstrap), and the verdict's ``statistic``, ``tolerance`` and
    ``passed``."""
    rng = np.random.default_rng(seed)
    rows = []
    groups = [("answer", "answer_phase")] + [("cut", "cut_phase")]
    for kind, column in groups:
        subset = records if kind == "answer" else records[records["cut_phase"] >= 0]
        for (mode, setting, phase), cell in subset.groupby(["mode", "setting", column], sort=False):
            n = len(cell)
            agree = int(cell["agree"].sum())
            lo, hi = stats.wilson_interval(agree, n, confidence)
            delta = cell["correct"].to_numpy(dtype=float) - cell["ref_correct"].to_numpy(dtype=float)
            if np.any(delta):
                boot = delta[rng.integers(0, n, size=(n_bootstrap, n))].mean(1)
                d_lo, d_hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
            else:
                d_lo = d_hi = 0.0
            max_diff, mean_diff = float(cell["max_abs_diff"].max()), float(cell["mean_abs_diff"].mean())
            statistic, bound = tolerance[setting]
            rows.append({
                "mode": mode, "setting": setting, "kind": kind, "phase": int(phase), "n": n,
                "max_abs_diff": max_diff, "mean_abs_diff": mean_diff,
                "agreement": agree / n, "agreement_lower": float(lo), "agreement_upper": float(hi),
                "ref_accuracy": float(cell["ref_correct"].mean()), "accuracy": float(cell["correct"].mean()),
                "accuracy_diff": float(delta.mean()), "accuracy_diff_lower": float(d_lo),
                "accuracy_diff_upper": float(d_hi), "statistic": statistic, "tolerance": bound,
                "passed": bool((max_diff if statistic == "max" else mean_diff) <= bound),
            })
    return pd.DataFrame(rows).sort_values(["kind", "mode", "setting", "phase"], kind="stable").reset_index(drop=True)


__all__ = ["DEFAULT_MODES", "DEFAULT_TOLERANCE", "DTYPES", "MODES", "STATISTICS", "answer_phase_variants", "conformance", "cut_period",
           "default_prefix_lengths", "donor_prompts", "phase_table"]
