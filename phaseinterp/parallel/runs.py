"""Data-parallel experiments over prompts, under ``torchrun`` or ``accelerate launch``.

`sharded_profile`, `sharded_ablate` and `sharded_gate_cycling` run `phase_profile`, `ablate`
and `gate_cycling` on a deterministic slice of the prompts per rank: the prompts are cut into
chunks of ``chunk_size`` (chunk ``c`` holds prompts ``c*chunk_size ..``) and chunk ``c`` goes
to rank ``c mod world_size``. Each finished chunk is written atomically to
``DIR/shards/chunk-NNNNNN.npz`` beside ``DIR/run.json`` (what the run is: model hash, task,
seed, settings), so a rerun after a crash or Ctrl-C skips the chunks already written, with
any number of ranks. Rank 0 gathers every chunk through ``torch.distributed`` (no shared
file system needed; it writes the chunks it lacks), merges them and returns the same result
a single process returns (per-prompt correctness and answer logits equal); the other ranks
return None. `merge` rebuilds the result from a directory alone and refuses shards of
another run, naming the field that differs.

Ranks, world size and the local rank come from the launcher's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``); the backend is NCCL with one GPU per rank
(``cuda:LOCAL_RANK``) when CUDA is available, gloo on CPU. Without a launcher everything
runs in this process (world size 1), with the same files.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch

from phaseinterp._checks import check_int
from phaseinterp.errors import UserInputError
from phaseinterp._files import atomic_write, check_write_target, json_default, progress_bar
from phaseinterp.parallel.launch import Launch, all_gather, gather_to_main, init_distributed, raise_any, rank_device
from phaseinterp.parallel.shards import (
    RUN_FILE, SHARD_DIR, SHARD_FORMAT, assemble, chunk_range, first_difference, mismatch, model_fingerprint,
    prompts_fingerprint, read_run, read_shard, shard_path, task_description, write_shard)


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
                                   flag="the same run's shard folder")
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
def _check_chunk_size(chunk_size) -> int:
    return check_int("chunk_size", chunk_size, 1, why=" (prompts per shard file)")


def _setup(model, task, prompts, n_per_residue, seed, device, chunk_size, model_sha256):
    """Launch, device, prompts and the identity fields shared by every experiment."""
    from phaseinterp._checks import check_device, check_n_per_residue
    from phaseinterp.tasks import resolve_task

    _check_chunk_size(chunk_size)
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
    return str(getattr(getattr(model, "cfg", None), "label", type(model).__name__))


def sharded_profile(
    model: torch.nn.Module,
    task: Any = None,
    n_per_residue: int = 250,
    *,
    out_dir: Union[str, os.PathLike],
    seed: int = 0,
    chunk_size: int = 256,
    batch_size: int = 64,
    device: Any = None,
    stride: Optional[int] = None,
    label: Optional[str] = None,
    confidence: float = 0.95,
    interval: str = "auto",
    n_bootstrap: int = 2000,
    n_permutations: int = 1999,
    prompts: Any = None,
    model_sha256: Optional[str] = None,
    progress: bool = True,
):
    """`phase_profile` data-parallel over prompts (see the module docstring): rank 0 returns
    the `PhaseProfile` a single ``phase_profile(model, task, n_per_residue, seed=seed, ...)``
    returns, the other ranks None. ``out_dir`` holds ``run.json`` and one shard per chunk of
    ``chunk_size`` prompts; a rerun skips the shards already there."""
    from phaseinterp.profile import INTERVALS, phase_profile

    if interval not in INTERVALS:
        raise UserInputError(f"interval={interval!r} is not one of {INTERVALS}")
    launch, model, task, prompts, header = _setup(model, task, prompts, n_per_residue, seed, device, chunk_size,
                                                  model_sha256)
    stride = stride if stride is not None else getattr(getattr(model, "cfg", None), "stride", None)
    if stride is None:
        raise UserInputError("the model has no cfg.stride; pass stride= explicitly")
    label = label if label is not None else _label(model)
    header.update(kind="profile", settings=dict(
        stride=stride, label=label, residue_modulus=prompts.residue_modulus, confidence=confidence, interval=interval,
        n_bootstrap=n_bootstrap, n_permutations=n_permutations))

    def evaluate(sub) -> dict[str, np.ndarray]:
        # Only the chunk's per-prompt records are kept; its own statistics are recomputed on
        # the merged records (n_permutations=1 keeps the discarded ones cheap).
        part = phase_profile(model, sub, seed=seed, batch_size=batch_size, stride=stride, label=label,
                             confidence=confidence, interval="wilson", n_permutations=1, progress=False)
        return {f"records/{c}": part.records[c].to_numpy() for c in part.records.columns}

    return _run(_Plan(header, evaluate), prompts, out_dir, launch, progress)


def sharded_ablate(
    model: torch.nn.Module,
    task: Any = None,
    *,
    out_dir: Union[str, os.PathLike],
    layer: Union[int, Sequence[int], None] = None,
    scope: str = "kv_head",
    heads: Optional[Sequence[Sequence[int]]] = None,
    n_per_residue: int = 72,
    n_calibration: int = 256,
    seed: int = 0,
    calibration_seed: int = 1,
    chunk_size: int = 64,
    batch_size: int = 64,
    method: str = "fast",
    device: Any = None,
    prompts: Any = None,
    model_sha256: Optional[str] = None,
    progress: bool = True,
):
    """`ablate` (per-KV-head mean replacement) data-parallel over prompts: rank 0 returns the
    `AblationResult` a single ``ablate(...)`` with the same arguments returns, the other ranks
    None. Each rank computes the calibration mean once (the same prompts on every rank)."""
    from phaseinterp.interventions._common import fixed_answer_position
    from phaseinterp.interventions.ablation import ablate, calibration_mean_z

    launch, model, task, prompts, header = _setup(model, task, prompts, n_per_residue, seed, device, chunk_size,
                                                  model_sha256)
    layers = None if layer is None else ([layer] if isinstance(layer, int) else list(layer))
    header.update(kind="ablate", settings=dict(
        layer=layers, scope=scope, heads=None if heads is None else [list(h) for h in heads],
        result_scope="custom" if heads is not None else scope, n_calibration=n_calibration,
        calibration_seed=calibration_seed, method=method, label=_label(model),
        residue_modulus=task.residue_modulus, stride=model.cfg.stride))
    state: dict[str, Any] = {}

    def prepare() -> None:
        answer_pos = fixed_answer_position(prompts)
        calib = task.calibration(n_calibration, seed=calibration_seed)
        if fixed_answer_position(calib) == answer_pos:  # else `ablate` raises with its own message
            state["mean"] = calibration_mean_z(model, calib.tokens, answer_pos, batch_size)

    def evaluate(sub) -> dict[str, np.ndarray]:
        r = ablate(model, task, layer=layer, scope=scope, heads=heads, n_calibration=n_calibration, seed=seed,
                   calibration_seed=calibration_seed, batch_size=batch_size, method=method, progress=False,
                   prompts=sub, calibration_mean=state.get("mean"))
        return {"residue": r.residue, "clean_correct": r.clean_correct, "knockout_correct": r.knockout_correct,
                "clean_logit_answer": r.clean_logit_answer, "knockout_logit_answer": r.knockout_logit_answer,
                "static/unit_layer": r.units.layer.to_numpy(), "static/unit_kv_head": r.units.kv_head.to_numpy(),
                "static/unit_heads": np.array([json.dumps(list(h)) for h in r.units.heads])}

    return _run(_Plan(header, evaluate, prepare), prompts, out_dir, launch, progress)


def sharded_gate_cycling(
    model: torch.nn.Module,
    task: Any = None,
    shifts: Optional[Sequence[int]] = None,
    *,
    out_dir: Union[str, os.PathLike],
    layers: Union[int, Sequence[int], None] = None,
    branch: str = "both",
    n_per_residue: int = 72,
    seed: int = 0,
    chunk_size: int = 128,
    batch_size: int = 64,
    n_boot: int = 1000,
    device: Any = None,
    prompts: Any = None,
    model_sha256: Optional[str] = None,
    progress: bool = True,
):
    """`gate_cycling` data-parallel over prompts: rank 0 returns the `CyclingResult` a single
    ``gate_cycling_profile(...)`` with the same arguments returns, the other ranks None."""
    from phaseinterp.interventions.gate_cycling_profile import gate_cycling_profile

    launch, model, task, prompts, header = _setup(model, task, prompts, n_per_residue, seed, device, chunk_size,
                                                  model_sha256)
    header.update(kind="cycle", settings=dict(
        shifts=None if shifts is None else [int(d) for d in np.atleast_1d(shifts)],
        layers=None if layers is None else np.atleast_1d(layers).astype(int).tolist(), branch=branch,
        n_boot=n_boot, label=_label(model), residue_modulus=task.residue_modulus, stride=model.cfg.stride))

    def evaluate(sub) -> dict[str, np.ndarray]:
        r = gate_cycling_profile(model, task, shifts, layers=layers, branch=branch, seed=seed, batch_size=batch_size,
                         n_boot=n_boot, progress=False, prompts=sub)
        return {"residue": r.residue, "correct": np.ascontiguousarray(r.correct.T),
                "static/shifts": np.asarray(r.shifts, dtype=np.int64)}

    return _run(_Plan(header, evaluate), prompts, out_dir, launch, progress)
