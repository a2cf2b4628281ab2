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

import hashlib
import io
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import pandas as pd
import torch

from phaseinterp._files import atomic_write, check_output_dir, json_default, progress_bar

SHARD_FORMAT = 1
RUN_FILE = "run.json"
SHARD_DIR = "shards"
KINDS = ("profile", "ablate", "cycle")
# Fields compared first when two runs disagree (the rest follow in sorted order).
IDENTITY_FIELDS = ("format", "kind", "model_sha256", "task", "seed", "n_prompts", "prompts_sha256", "chunk_size")


# ------------------------------------------------------------------ launcher
@dataclass(frozen=True)
class Launch:
    """This process's place in the job: ``rank`` of ``world_size``, ``local_rank`` on its machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer") from None


def launch_info() -> Launch:
    """Rank, world size and local rank: from the process group when one is running, else from
    the launcher's environment (``torchrun`` and ``accelerate launch`` set ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``), else a single process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return Launch(torch.distributed.get_rank(), torch.distributed.get_world_size(), _env_int("LOCAL_RANK", 0))
    world = _env_int("WORLD_SIZE", 1)
    rank, local = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if world < 1 or not (0 <= rank < world):
        raise ValueError(f"RANK={rank} is out of range for WORLD_SIZE={world} (0..{world - 1})")
    return Launch(rank, world, local)


def rank_device(launch: Optional[Launch] = None) -> torch.device:
    """``cuda:LOCAL_RANK`` when CUDA is available, else the CPU."""
    launch = launch or launch_info()
    if torch.cuda.is_available():
        return torch.device("cuda", launch.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(backend: Optional[str] = None) -> Launch:
    """Join the launcher's process group (once; a no-op for a single process or when already
    joined). ``backend`` defaults to ``"nccl"`` when CUDA is available, else ``"gloo"``."""
    launch = launch_info()
    if launch.world_size > 1 and not torch.distributed.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(rank_device(launch))
        torch.distributed.init_process_group(backend=backend)
    return launch


_OBJECT_GROUPS: dict = {}


def _object_group():
    """A gloo group for Python-object collectives (NCCL moves only CUDA tensors)."""
    if torch.distributed.get_backend() == "gloo":
        return None
    key = id(torch.distributed.distributed_c10d._get_default_group())
    if key not in _OBJECT_GROUPS:
        _OBJECT_GROUPS[key] = torch.distributed.new_group(backend="gloo")
    return _OBJECT_GROUPS[key]


def _all_gather(obj: Any, launch: Launch) -> list:
    if launch.world_size == 1:
        return [obj]
    out: list = [None] * launch.world_size
    torch.distributed.all_gather_object(out, obj, group=_object_group())
    return out


def _gather_to_main(obj: Any, launch: Launch) -> Optional[list]:
    if launch.world_size == 1:
        return [obj]
    out = [None] * launch.world_size if launch.is_main else None
    torch.distributed.gather_object(obj, out, dst=0, group=_object_group())
    return out


def _raise_any(error: Optional[str], launch: Launch) -> None:
    """Every rank raises when any rank found an error (so none waits on a collective)."""
    errors = [e for e in _all_gather(error, launch) if e]
    if errors:
        raise ValueError(errors[0])


# ------------------------------------------------------------------ identity
def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 of the model's config (``cfg.to_dict()`` when it has one) and every tensor of its
    ``state_dict`` (names, dtypes, shapes, bytes): two runs of one experiment agree on it only
    with the same weights. Reads every weight once; for very large checkpoints pass a recorded
    hash (``model_sha256=``) instead."""
    h = hashlib.sha256()
    cfg = getattr(model, "cfg", None)
    if hasattr(cfg, "to_dict"):
        h.update(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _prompts_fingerprint(batch) -> str:
    h = hashlib.sha256()
    for t in (batch.tokens, batch.answer, batch.answer_pos):
        h.update(t.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


def _task_description(task, batch) -> Any:
    if hasattr(task, "to_dict"):
        return task.to_dict()
    return getattr(batch, "task", None) or repr(task)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for key, value in d.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _first_difference(a: dict, b: dict) -> Optional[tuple[str, Any, Any]]:
    """The first field (dotted path) where two run headers differ, with both values."""
    fa, fb = _flatten(json.loads(json.dumps(a, default=json_default))), _flatten(
        json.loads(json.dumps(b, default=json_default)))
    order = sorted(set(fa) | set(fb), key=lambda k: (
        next((i for i, f in enumerate(IDENTITY_FIELDS) if k == f or k.startswith(f + ".")), len(IDENTITY_FIELDS)), k))
    for key in order:
        if fa.get(key, "<missing>") != fb.get(key, "<missing>"):
            return key, fa.get(key, "<missing>"), fb.get(key, "<missing>")
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, default=json_default) if not isinstance(value, str) else value
    return text if len(text) <= 70 else text[:67] + "..."


def _mismatch(what: str, other: str, diff: tuple[str, Any, Any]) -> str:
    field, mine, theirs = diff
    return (f"{what} does not belong to {other}: field {field!r} differs ({_short(mine)} vs {_short(theirs)}); "
            "merge only shards of one model, task, seed and settings")


# -------------------------------------------------------------------- shards
def shard_path(directory: Path, chunk: int) -> Path:
    return Path(directory) / SHARD_DIR / f"chunk-{chunk:06d}.npz"


def _write_shard(path: Path, header: dict, chunk: int, index: np.ndarray, arrays: dict[str, np.ndarray]) -> None:
    payload = {"header": np.array(json.dumps(header, sort_keys=True, default=json_default)),
               "chunk": np.array(chunk), "index": np.asarray(index, dtype=np.int64)}
    dtypes = {}
    for name, value in arrays.items():
        value = np.asarray(value)
        dtypes[name] = str(value.dtype)
        if value.dtype == object:  # strings (and nothing else) are stored as fixed-width unicode
            value = value.astype(str)
        payload[f"a/{name}"] = value
    payload["dtypes"] = np.array(json.dumps(dtypes))
    buffer = io.BytesIO()
    np.savez(buffer, **payload)
    atomic_write(path, buffer.getvalue())


def _read_shard(path: Path) -> tuple[dict, int, np.ndarray, dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(str(data["header"]))
            chunk, index = int(data["chunk"]), data["index"]
            dtypes = json.loads(str(data["dtypes"]))
            arrays = {name: data[f"a/{name}"] for name in dtypes}
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{path} is not a readable phaseinterp shard ({err}); delete it to recompute") from None
    for name, dtype in dtypes.items():
        if dtype == "object":
            arrays[name] = arrays[name].astype(object)
    return header, chunk, index, arrays


def _chunk_range(chunk: int, chunk_size: int, n: int) -> range:
    return range(chunk * chunk_size, min((chunk + 1) * chunk_size, n))


# -------------------------------------------------------------------- engine
@dataclass
class _Plan:
    """One experiment: how to evaluate a chunk of prompts, how to build the result from all of them."""

    header: dict
    evaluate: Callable[[Any], dict[str, np.ndarray]]  # sub-batch -> per-prompt arrays (prompt axis first)
    prepare: Callable[[], None] = lambda: None  # once per rank, before its first missing chunk


def _run(plan: _Plan, batch, out_dir, launch: Launch, progress: bool):
    header, n, chunk_size = plan.header, plan.header["n_prompts"], plan.header["chunk_size"]
    directory = check_output_dir(out_dir)
    (directory / SHARD_DIR).mkdir(parents=True, exist_ok=True)
    ranks = _all_gather(header, launch)
    diff = next(((r, d) for r, h in enumerate(ranks) if (d := _first_difference(h, ranks[0]))), None)
    _raise_any(_mismatch(f"rank {diff[0]}", "rank 0's run", diff[1]) if diff else None, launch)

    run_file = directory / RUN_FILE
    error = None
    if run_file.is_file():
        try:
            diff = _first_difference(header, _read_run(run_file))
            error = _mismatch("this run", f"the run already in {directory}", diff) if diff else None
        except ValueError as err:
            error = str(err)
    n_chunks = math.ceil(n / chunk_size)
    mine = [c for c in range(n_chunks) if c % launch.world_size == launch.rank]
    done: dict[int, dict] = {}
    for c in mine:  # shards on disk from an earlier try: checked, then reused
        path = shard_path(directory, c)
        if error is None and path.is_file():
            try:
                old, chunk, index, arrays = _read_shard(path)
            except ValueError as err:
                error = str(err)
                continue
            diff = _first_difference(header, old)
            if diff:
                error = _mismatch(str(path), f"the run in {directory}", diff)
            elif chunk != c or not np.array_equal(index, np.asarray(_chunk_range(c, chunk_size, n))):
                rows = _chunk_range(c, chunk_size, n)
                error = (f"{path} holds prompts {index[:1].tolist()}.. but chunk {c} is prompts "
                         f"{rows.start}..{rows.stop - 1}")
            else:
                done[c] = arrays
    _raise_any(error, launch)
    if not run_file.is_file():
        atomic_write(run_file, json.dumps(header, indent=2, sort_keys=True, default=json_default).encode())

    todo = [c for c in mine if c not in done]
    bar = progress_bar(progress and launch.is_main, len(mine), f"{header['kind']} (rank 0 of {launch.world_size})",
                       initial=len(done))
    try:
        if todo:
            plan.prepare()
        for c in todo:
            rows = _chunk_range(c, chunk_size, n)
            arrays = plan.evaluate(batch.subset(slice(rows.start, rows.stop)))
            _write_shard(shard_path(directory, c), header, c, np.arange(rows.start, rows.stop), arrays)
            done[c] = arrays
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()

    gathered = _gather_to_main(done, launch)
    if not launch.is_main:
        return None
    chunks: dict[int, dict] = {}
    for part in gathered:
        chunks.update(part)
    for c, arrays in chunks.items():  # no shared file system: rank 0 keeps a complete copy
        if not shard_path(directory, c).is_file():
            rows = _chunk_range(c, chunk_size, n)
            _write_shard(shard_path(directory, c), header, c, np.arange(rows.start, rows.stop), arrays)
    return _assemble(header, [chunks[c] for c in range(n_chunks)])


def _read_run(path: Path) -> dict:
    try:
        header = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a readable run description ({err})") from None
    if not isinstance(header, dict) or header.get("kind") not in KINDS:
        raise ValueError(f"{path} is not a phaseinterp run description (kind must be one of {KINDS})")
    return header


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-prompt arrays joined in prompt order; ``static/`` arrays (the same in every chunk) once."""
    return {name: parts[0][name] if name.startswith("static/") else np.concatenate([p[name] for p in parts])
            for name in parts[0]}


def _assemble(header: dict, parts: list[dict[str, np.ndarray]]):
    """The experiment's result from every chunk's arrays, in prompt order."""
    arrays, s = _concat(parts), header["settings"]
    if header["kind"] == "profile":
        from phaseinterp.profile import profile_from_records

        columns = [name[len("records/"):] for name in parts[0] if name.startswith("records/")]
        records = pd.DataFrame({c: arrays[f"records/{c}"] for c in columns})
        return profile_from_records(records, s["residue_modulus"], s["stride"], label=s["label"],
                                    confidence=s["confidence"], interval=s["interval"], n_bootstrap=s["n_bootstrap"],
                                    n_permutations=s["n_permutations"], seed=header["seed"])
    if header["kind"] == "ablate":
        from phaseinterp.interventions.ablation import AblationResult

        units = pd.DataFrame({"layer": arrays["static/unit_layer"], "kv_head": arrays["static/unit_kv_head"],
                              "heads": [tuple(int(h) for h in json.loads(t)) for t in arrays["static/unit_heads"]]})
        return AblationResult(
            units=units, residue=arrays["residue"], clean_correct=arrays["clean_correct"],
            knockout_correct=arrays["knockout_correct"], residue_modulus=s["residue_modulus"], stride=s["stride"],
            scope=s["result_scope"], model_label=s["label"], n_calibration=s["n_calibration"],
            clean_logit_answer=arrays["clean_logit_answer"], knockout_logit_answer=arrays["knockout_logit_answer"])
    from phaseinterp.interventions.gate_cycling import CyclingResult

    return CyclingResult(shifts=tuple(int(d) for d in arrays["static/shifts"]), residue=arrays["residue"],
                         correct=np.ascontiguousarray(arrays["correct"].T), residue_modulus=s["residue_modulus"],
                         stride=s["stride"], model_label=s["label"], n_boot=s["n_boot"], seed=header["seed"])


def merge(directory: Union[str, os.PathLike]):
    """The result of the run in ``directory`` from its files alone (``run.json`` + every
    ``shards/chunk-*.npz``). Refuses a shard of another run (naming the differing field:
    model hash, task, seed, a setting), an unreadable one, or a missing chunk (naming its
    prompts: rerun the same command to finish them)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{str(directory)!r} is not a directory")
    run_file = directory / RUN_FILE
    if not run_file.is_file():
        raise ValueError(f"{run_file} does not exist: {str(directory)!r} is not a sharded run directory")
    header = _read_run(run_file)
    n, chunk_size = header["n_prompts"], header["chunk_size"]
    n_chunks = math.ceil(n / chunk_size)
    parts: dict[int, dict] = {}
    for path in sorted((directory / SHARD_DIR).glob("chunk-*.npz")):
        old, chunk, index, arrays = _read_shard(path)
        diff = _first_difference(header, old)
        if diff:
            raise ValueError(_mismatch(str(path), f"the run in {directory} ({RUN_FILE})", diff))
        expected = re.fullmatch(r"chunk-(\d+)\.npz", path.name)
        if expected is None or int(expected.group(1)) != chunk or not (0 <= chunk < n_chunks) or not np.array_equal(
                index, np.asarray(_chunk_range(chunk, chunk_size, n))):
            raise ValueError(f"{path} holds chunk {chunk} (prompts {index[:1].tolist()}..), which does not fit "
                             f"this run's {n_chunks} chunks of {chunk_size} prompts")
        parts[chunk] = arrays
    missing = [c for c in range(n_chunks) if c not in parts]
    if missing:
        spans = ", ".join(f"{r.start}..{r.stop - 1}" for r in (_chunk_range(c, chunk_size, n) for c in missing[:5]))
        raise ValueError(f"{directory} lacks {len(missing)} of {n_chunks} chunks (prompts {spans}"
                         f"{', ...' if len(missing) > 5 else ''}); rerun the same command to finish them")
    return _assemble(header, [parts[c] for c in range(n_chunks)])


# --------------------------------------------------------------- experiments
def _check_chunk_size(chunk_size) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size!r} must be an integer >= 1 (prompts per shard file)")
    return chunk_size


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
        raise ValueError("prompts holds 0 prompts")
    header = dict(format=SHARD_FORMAT, model_sha256=model_sha256 or model_fingerprint(model),
                  task=_task_description(task, prompts), seed=seed, n_prompts=len(prompts),
                  prompts_sha256=_prompts_fingerprint(prompts), chunk_size=chunk_size)
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
    batch_size: int = 256,
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
        raise ValueError(f"interval={interval!r} is not one of {INTERVALS}")
    launch, model, task, prompts, header = _setup(model, task, prompts, n_per_residue, seed, device, chunk_size,
                                                  model_sha256)
    stride = stride if stride is not None else getattr(getattr(model, "cfg", None), "stride", None)
    if stride is None:
        raise ValueError("the model has no cfg.stride; pass stride= explicitly")
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
    batch_size: int = 128,
    n_boot: int = 1000,
    device: Any = None,
    prompts: Any = None,
    model_sha256: Optional[str] = None,
    progress: bool = True,
):
    """`gate_cycling` data-parallel over prompts: rank 0 returns the `CyclingResult` a single
    ``gate_cycling(...)`` with the same arguments returns, the other ranks None."""
    from phaseinterp.interventions.gate_cycling import gate_cycling

    launch, model, task, prompts, header = _setup(model, task, prompts, n_per_residue, seed, device, chunk_size,
                                                  model_sha256)
    header.update(kind="cycle", settings=dict(
        shifts=None if shifts is None else [int(d) for d in np.atleast_1d(shifts)],
        layers=None if layers is None else np.atleast_1d(layers).astype(int).tolist(), branch=branch,
        n_boot=n_boot, label=_label(model), residue_modulus=task.residue_modulus, stride=model.cfg.stride))

    def evaluate(sub) -> dict[str, np.ndarray]:
        r = gate_cycling(model, task, shifts, layers=layers, branch=branch, seed=seed, batch_size=batch_size,
                         n_boot=n_boot, progress=False, prompts=sub)
        return {"residue": r.residue, "correct": np.ascontiguousarray(r.correct.T),
                "static/shifts": np.asarray(r.shifts, dtype=np.int64)}

    return _run(_Plan(header, evaluate), prompts, out_dir, launch, progress)
