"""Data-parallel experiments over prompts, under ``torchrun`` or ``accelerate launch``.

`sharded_profile`, `sharded_ablate` and `sharded_gate_cycling_profile` cut the prompts into chunks of
``chunk_size``, chunk ``c`` to rank ``c mod world_size``, each written atomically to
``DIR/shards/chunk-NNNNNN.npz`` beside ``DIR/run.json``; a rerun skips the chunks written. Rank 0
gathers every chunk through ``torch.distributed`` and returns the result a single process returns;
the other ranks return None. Each variant is built from its single-process function by `sharded`."""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from phaseinterp._checks import DEFAULT_N_PER_RESIDUE, check_device, check_int, check_n_per_residue, prompt_slices
from phaseinterp._files import atomic_write, check_write_target, json_default, progress_bar
from phaseinterp.errors import UserInputError
from phaseinterp.interventions._common import fixed_answer_position
from phaseinterp.interventions.ablation import ablate, calibration_mean_z
from phaseinterp.interventions.gate_cycling import gate_cycling_profile
from phaseinterp.models.protocol import phase_model
from phaseinterp.parallel.launch import Launch, all_gather, gather_to_main, init_distributed, raise_any, rank_device
from phaseinterp.parallel.shards import (RUN_FILE, SHARD_DIR, SHARD_FORMAT, assemble, chunk_range, first_difference,
                                         mismatch, model_fingerprint, prompts_fingerprint, read_run, read_shard,
                                         shard_path, task_description, write_shard)
from phaseinterp.profile import INTERVALS, phase_profile
from phaseinterp.tasks import resolve_task


# -------------------------------------------------------------------- engine
@dataclass
class _Plan:
    """One experiment: how to evaluate a chunk of prompts, how to build the result from all of them."""

    header: dict
    evaluate: Callable[[Any], dict[str, np.ndarray]]  # sub-batch -> per-prompt arrays (prompt axis first)
    prepare: Callable[[], None] = lambda: None  # once per rank, before its first missing chunk


def _run(plan: _Plan, batch, out_dir, launch: Launch, progress: bool):
    header, n, chunk_size = plan.header, plan.header["n_prompts"], plan.header["chunk_size"]
    # the shared write rule: a shard folder (of this run: its run.json is checked below) is resumed,
    # anything else there is refused
    directory = check_write_target(out_dir, "shard folder", overwrite=True, name="out_dir",
                                   flag="the same run's shard folder", staged=False)
    (directory / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    ranks = all_gather(header, launch)
    diff = next(((r, d) for r, h in enumerate(ranks) if (d := first_difference(h, ranks[0]))), None)
    raise_any(mismatch(f"rank {diff[0]}", "rank 0's run", diff[1]) if diff else None, launch)

    run_file = directory / RUN_FILE
    error = None
    if run_file.is_file():
        try:
            diff = first_difference(header, read_run(run_file))
            error = mismatch("this run", f"the run already in {directory}", diff) if diff else None
        except ValueError as err:
            error = str(err)
    n_chunks = math.ceil(n / chunk_size)
    mine = [c for c in range(n_chunks) if c % launch.world_size == launch.rank]
    done: dict[int, dict] = {}
    for c in mine:  # shards on disk from an earlier try: checked, then reused
        path = shard_path(directory, c)
        if error is None and path.is_file():
            try:
                old, chunk, index, arrays = read_shard(path)
            except ValueError as err:
                error = str(err)
                continue
            diff = first_difference(header, old)
            if diff:
                error = mismatch(str(path), f"the run in {directory}", diff)
            elif chunk != c or not np.array_equal(index, np.asarray(chunk_range(c, chunk_size, n))):
                rows = chunk_range(c, chunk_size, n)
                error = (f"{path} holds prompts {index[:1].tolist()}.. but chunk {c} is prompts "
                         f"{rows.start}..{rows.stop - 1}")
            else:
                done[c] = arrays
    raise_any(error, launch)
    if not run_file.is_file():
        atomic_write(run_file, json.dumps(header, indent=2, sort_keys=True, default=json_default).encode())

    todo = [c for c in mine if c not in done]
    bar = progress_bar(progress and launch.is_main, len(mine), f"{header['kind']} (rank 0 of {launch.world_size})",
                       initial=len(done))
    try:
        if todo:
            plan.prepare()
        for c in todo:
            rows = chunk_range(c, chunk_size, n)
            with prompt_slices():  # a chunk may lack residues; the merged records are checked when assembled
                arrays = plan.evaluate(batch.subset(slice(rows.start, rows.stop)))
            write_shard(shard_path(directory, c), header, c, np.arange(rows.start, rows.stop), arrays)
            done[c] = arrays
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()

    gathered = gather_to_main(done, launch)
    if not launch.is_main:
        return None
    chunks: dict[int, dict] = {}
    for part in gathered:
        chunks.update(part)
    for c, arrays in chunks.items():  # no shared file system: rank 0 keeps a complete copy
        if not shard_path(directory, c).is_file():
            rows = chunk_range(c, chunk_size, n)
            write_shard(shard_path(directory, c), header, c, np.arange(rows.start, rows.stop), arrays)
    return assemble(header, [chunks[c] for c in range(n_chunks)])


# --------------------------------------------------------------- experiments
def _setup(model, task, prompts, n_per_residue, seed, device, chunk_size, model_sha256):
    """Launch, device, prompts and the identity fields shared by every experiment."""
    check_int("chunk_size", chunk_size, 1, why=" (prompts per shard file)")
    launch = init_distributed()
    device = check_device(device)
    if device is None and launch.world_size > 1 and torch.cuda.is_available():
        device = rank_device(launch)
    if device is not None:
        model = model.to(device)
    task = resolve_task(model, task)
    if prompts is None and hasattr(task, "tokens"):  # a ready TaskBatch, as phase_profile accepts
        prompts = task
    if prompts is None:
        check_n_per_residue(n_per_residue, task.residue_modulus)
        prompts = task.generate(n_per_residue, seed=seed)
    elif len(prompts) == 0:
        raise UserInputError("prompts holds 0 prompts")
    header = dict(format=SHARD_FORMAT, model_sha256=model_sha256 or model_fingerprint(model),
                  task=task_description(task, prompts), seed=seed, n_prompts=len(prompts),
                  prompts_sha256=prompts_fingerprint(prompts), chunk_size=chunk_size)
    return launch, model, task, prompts, header


def _label(model) -> str:
    return phase_model(model).label


# --------------------------------------------------- a sharded variant from its single-process function
_SETUP = ("n_per_residue", "seed", "device", "prompts")  # `_setup` uses these; the rest go to each chunk
_EXTRAS = (  # the sharded variant's own keyword-only parameters, after the single function's
    inspect.Parameter("out_dir", inspect.Parameter.KEYWORD_ONLY),
    inspect.Parameter("chunk_size", inspect.Parameter.KEYWORD_ONLY),
    inspect.Parameter("model_sha256", inspect.Parameter.KEYWORD_ONLY, default=None),
)


def _jsonable(name: str, value: Any) -> Any:
    """A setting as it is recorded in ``run.json`` (and compared on resume)."""
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, (tuple, list, range, np.ndarray)):
        return [_jsonable(name, v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise UserInputError(f"{name}={type(value).__name__} cannot be recorded in a sharded run's run.json "
                         "(give it as numbers, strings or lists)")


def sharded(single: Callable, *, kind: str, chunk_size: int, refuse: dict[str, str]):
    """The data-parallel variant of ``single`` (module docstring), built from its signature: every
    parameter of ``single`` but those in ``refuse`` (name -> why), recorded in ``run.json`` and passed to
    each chunk, plus ``out_dir``, ``chunk_size`` and ``model_sha256``."""
    signature = inspect.signature(single)
    # what `_setup` needs and the single function may lack (phase_profile takes prompts as its task;
    # gate_cycling_profile runs on the model's device): keyword-only, default None
    missing = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
               for name in ("device", "prompts") if name not in signature.parameters]
    signature = signature.replace(parameters=[*signature.parameters.values(), *missing])
    params = [p for name, p in signature.parameters.items() if name not in refuse]
    signature = signature.replace(parameters=[p for p in signature.parameters.values() if p.name != "spec"])
    experiment = _EXPERIMENTS[kind]

    def run(*args, **kwargs):
        bound_extras = {name: kwargs.pop(name) for name in ("out_dir", "chunk_size", "model_sha256") if name in kwargs}
        spec = kwargs.pop("spec", None)
        if spec is not None:  # the single function's spec: its options, as if passed one by one
            spec_type = getattr(single, "__spec_type__", None)
            if spec_type is None or not isinstance(spec, spec_type):
                raise UserInputError(f"spec={type(spec).__name__} is not a "
                                     f"{getattr(spec_type, '__name__', 'spec')} (sharded_{kind}'s options)")
            clash = [name for name in spec.options() if name in kwargs]
            if clash:
                raise UserInputError(f"sharded_{kind}: {', '.join(f'{k}=' for k in clash)} given beside spec=: set "
                                     "it in the spec instead")
            kwargs.update(spec.options(changed_only=True))
        if "out_dir" not in bound_extras:
            raise UserInputError(f"sharded_{kind}: out_dir= is required (the run's folder: run.json and shards/)")
        for name, why in refuse.items():
            if name in kwargs and kwargs[name] is not None and kwargs[name] != signature.parameters[name].default:
                raise UserInputError(f"{name}= does not apply to a sharded run: {why}")
            kwargs.pop(name, None)
        try:
            bound = signature.bind(*args, **kwargs)  # the single function's parameters + device / prompts
        except TypeError as err:
            raise UserInputError(f"sharded_{kind}: {err}") from None
        bound.apply_defaults()
        settings = {k: v for k, v in bound.arguments.items() if k not in refuse}
        model, task, progress = settings.pop("model"), settings.pop("task"), settings.pop("progress", True)
        setup = {name: settings.pop(name, None) for name in _SETUP}
        if setup["n_per_residue"] is None and setup["prompts"] is None:
            # the single function's "None: its default size" (gate_cycling_profile: 72; a baseline, whose
            # size it would take instead, is refused here)
            setup["n_per_residue"] = DEFAULT_N_PER_RESIDUE
        launch, model, task, prompts, header = _setup(
            model, task, setup["prompts"], setup["n_per_residue"], setup["seed"] or 0, setup["device"],
            bound_extras.get("chunk_size", chunk_size), bound_extras.get("model_sha256"))
        settings = experiment.resolve(model, task, prompts, settings)
        header.update(kind=experiment.header_kind, settings={k: _jsonable(k, v) for k, v in settings.items()})
        plan = experiment.plan(model, task, prompts, header, settings, setup["seed"] or 0)
        return _run(plan, prompts, bound_extras["out_dir"], launch, progress)

    run.__signature__ = signature.replace(parameters=[
        *[p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD],
        *(p.replace(default=chunk_size) if p.name == "chunk_size" else p for p in _EXTRAS)])
    run.__name__ = run.__qualname__ = f"sharded_{kind}"
    run.__doc__ = (f"`{single.__name__}` data-parallel over prompts: rank 0 returns the result a single "
                   f"``{single.__name__}(...)`` with the same arguments returns, the other ranks None. ``out_dir`` holds "
                   f"``run.json`` and one shard per chunk of ``chunk_size`` prompts (default {chunk_size}); a "
                   "rerun skips the shards already there. Every parameter of "
                   f"`{single.__name__}` applies" + (f" but {', '.join(refuse)}" if refuse else "") +
                   " (module docstring).")
    return run


@dataclass
class _Experiment:
    header_kind: str  # run.json's "kind", which `shards.assemble` reads
    resolve: Callable  # (model, task, prompts, settings) -> settings with what assemble needs filled in
    plan: Callable  # (model, task, prompts, header, settings, seed) -> _Plan


def _profile_resolve(model, task, prompts, settings):
    if settings["interval"] not in INTERVALS:
        raise UserInputError(f"interval={settings['interval']!r} is not one of {INTERVALS}")
    if settings.get("stride") is None:
        settings["stride"] = phase_model(model).stride
    if settings["stride"] is None:
        raise UserInputError("the model has no cfg.stride; pass stride= explicitly")
    settings["label"] = settings.get("label") if settings.get("label") is not None else _label(model)
    settings["residue_modulus"] = prompts.residue_modulus
    return settings


def _profile_plan(model, task, prompts, header, settings, seed):
    per_chunk = {k: v for k, v in settings.items() if k not in ("residue_modulus", "n_bootstrap", "n_permutations",
                                                                "interval")}

    def evaluate(sub) -> dict[str, np.ndarray]:
        # Only the chunk's per-prompt records are kept; its own statistics are recomputed on
        # the merged records (n_permutations=1 keeps the discarded ones cheap).
        part = phase_profile(model, sub, seed=seed, interval="wilson", n_permutations=1, progress=False, **per_chunk)
        return {f"records/{c}": part.records[c].to_numpy() for c in part.records.columns}

    return _Plan(header, evaluate)


def _ablate_resolve(model, task, prompts, settings):
    layer = settings.get("layer")
    settings["layer"] = None if layer is None else ([layer] if isinstance(layer, (int, np.integer)) else list(layer))
    heads = settings.get("heads")
    settings["heads"] = None if heads is None else [list(h) for h in heads]
    settings["result_scope"] = "custom" if heads is not None else settings["scope"]
    settings.update(label=_label(model), residue_modulus=task.residue_modulus, stride=model.cfg.stride)
    return settings


def _ablate_plan(model, task, prompts, header, settings, seed):
    per_chunk = {k: v for k, v in settings.items() if k not in ("result_scope", "label", "residue_modulus", "stride")}
    state: dict[str, Any] = {}

    def prepare() -> None:
        answer_pos = fixed_answer_position(prompts)
        calib = task.calibration(settings["n_calibration"], seed=settings["calibration_seed"])
        if fixed_answer_position(calib) == answer_pos:  # else `ablate` raises with its own message
            state["mean"] = calibration_mean_z(model, calib.tokens, answer_pos, settings["batch_size"])

    def evaluate(sub) -> dict[str, np.ndarray]:
        r = ablate(model, task, seed=seed, progress=False, prompts=sub, calibration_mean=state.get("mean"),
                   **per_chunk)
        return {"residue": r.residue, "clean_correct": r.clean_correct, "knockout_correct": r.knockout_correct,
                "clean_logit_answer": r.clean_logit_answer, "knockout_logit_answer": r.knockout_logit_answer,
                "static/unit_layer": r.units.layer.to_numpy(), "static/unit_kv_head": r.units.kv_head.to_numpy(),
                "static/unit_heads": np.array([json.dumps(list(h)) for h in r.units.heads])}

    return _Plan(header, evaluate, prepare)


def _cycle_resolve(model, task, prompts, settings):
    shifts, layers, kv_heads = settings.get("shifts"), settings.get("layers"), settings.get("kv_heads")
    settings["shifts"] = None if shifts is None else [int(d) for d in np.atleast_1d(shifts)]
    settings["layers"] = None if layers is None else np.atleast_1d(layers).astype(int).tolist()
    settings["kv_heads"] = None if kv_heads is None else np.atleast_1d(kv_heads).astype(int).tolist()
    settings.update(label=_label(model), residue_modulus=task.residue_modulus, stride=model.cfg.stride)
    return settings


def _cycle_plan(model, task, prompts, header, settings, seed):
    per_chunk = {k: v for k, v in settings.items() if k not in ("label", "residue_modulus", "stride")}

    def evaluate(sub) -> dict[str, np.ndarray]:
        r = gate_cycling_profile(model, task, seed=seed, progress=False, prompts=sub, **per_chunk)
        return {"residue": r.residue, "correct": np.ascontiguousarray(r.correct.T),
                "static/shifts": np.asarray(r.shifts, dtype=np.int64)}

    return _Plan(header, evaluate)


_EXPERIMENTS = {"profile": _Experiment("profile", _profile_resolve, _profile_plan),
                "ablate": _Experiment("ablate", _ablate_resolve, _ablate_plan),
                "gate_cycling_profile": _Experiment("cycle", _cycle_resolve, _cycle_plan)}


sharded_profile = sharded(phase_profile, kind="profile", chunk_size=256, refuse={
    "tokenizer": "the prompts are the task's token ids"})
sharded_ablate = sharded(ablate, kind="ablate", chunk_size=64, refuse={
    "calibration_mean": "each rank computes the calibration mean once, from n_calibration and calibration_seed"})
sharded_gate_cycling_profile = sharded(
    gate_cycling_profile, kind="gate_cycling_profile",
    chunk_size=128, refuse={"baseline": "the unshifted row is computed per chunk (shift 0)"})
