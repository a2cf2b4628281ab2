"""The files of a sharded run (`phaseinterp.parallel`): ``DIR/run.json`` and one atomically written
``DIR/shards/chunk-NNNNNN.npz`` per chunk; run identity, and `merge`, which rebuilds the result from a
directory and refuses shards of another run, naming the field that differs."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import zipfile
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import pandas as pd
import torch

from phaseinterp._checks import check_int
from phaseinterp._files import atomic_write, check_read_path, json_default
from phaseinterp.errors import UserInputError
from phaseinterp.interventions.ablation import AblationResult
from phaseinterp.interventions.gate_cycling import CyclingResult
from phaseinterp.profile import profile_from_records

SHARD_FORMAT = 1
RUN_FILE = "run.json"
SHARD_DIR = "shards"
KINDS = ("profile", "ablate", "cycle")
# Fields compared first when two runs disagree (the rest follow in sorted order).
IDENTITY_FIELDS = ("format", "kind", "model_sha256", "task", "seed", "n_prompts", "prompts_sha256", "chunk_size")


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


def prompts_fingerprint(batch) -> str:
    h = hashlib.sha256()
    for t in (batch.tokens, batch.answer, batch.answer_pos):
        h.update(t.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


def task_description(task, batch) -> Any:
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


def first_difference(a: dict, b: dict) -> Optional[tuple[str, Any, Any]]:
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


def mismatch(what: str, other: str, diff: tuple[str, Any, Any]) -> str:
    field, mine, theirs = diff
    return (f"{what} does not belong to {other}: field {field!r} differs ({_short(mine)} vs {_short(theirs)}); "
            "merge only shards of one model, task, seed and settings")


# -------------------------------------------------------------------- shards
def shard_path(directory: Path, chunk: int) -> Path:
    return Path(directory) / SHARD_DIR / f"chunk-{chunk:06d}.npz"


def write_shard(path: Path, header: dict, chunk: int, index: np.ndarray, arrays: dict[str, np.ndarray]) -> None:
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
    payload["sha256"] = np.array(_digest(payload))
    buffer = io.BytesIO()
    np.savez(buffer, **payload)
    atomic_write(path, buffer.getvalue())


def _digest(payload: dict[str, np.ndarray]) -> str:
    """SHA-256 of a shard's stored arrays (names, dtypes, shapes and bytes; its own ``sha256`` left out)."""
    h = hashlib.sha256()
    for name in sorted(k for k in payload if k != "sha256"):
        value = np.ascontiguousarray(payload[name])
        h.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def read_shard(path: Path) -> tuple[dict, int, np.ndarray, dict[str, np.ndarray]]:
    """A shard's header, chunk, prompt indices and arrays; an unreadable shard, or one whose arrays no
    longer match the SHA-256 written with them (edited, or damaged), is a `UserInputError` naming it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            stored = {name: data[name] for name in data.files}
        header = json.loads(str(stored["header"]))
        chunk, index = int(stored["chunk"]), stored["index"]
        dtypes = json.loads(str(stored["dtypes"]))
        arrays = {name: stored[f"a/{name}"] for name in dtypes}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise UserInputError(f"{path} is not a readable phaseinterp shard ({err}); delete it to recompute") from None
    if "sha256" in stored and str(stored["sha256"]) != _digest(stored):  # (a shard written before 0.4 has none)
        raise UserInputError(f"{path} was changed after it was written (its arrays no longer match their SHA-256); "
                             "delete it to recompute")
    for name, dtype in dtypes.items():
        if dtype == "object":
            arrays[name] = arrays[name].astype(object)
    return header, chunk, index, arrays


def chunk_range(chunk: int, chunk_size: int, n: int) -> range:
    return range(chunk * chunk_size, min((chunk + 1) * chunk_size, n))


def read_run(path: Path) -> dict:
    try:
        header = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserInputError(f"{path} is not a readable run description ({err})") from None
    if not isinstance(header, dict) or header.get("kind") not in KINDS:
        raise UserInputError(f"{path} is not a phaseinterp run description (kind must be one of {KINDS})")
    for name in ("n_prompts", "chunk_size"):
        check_int(f"{path}: {name}", header.get(name), 1)
    return header


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-prompt arrays joined in prompt order; ``static/`` arrays (the same in every chunk) once."""
    return {name: parts[0][name] if name.startswith("static/") else np.concatenate([p[name] for p in parts])
            for name in parts[0]}


def assemble(header: dict, parts: list[dict[str, np.ndarray]]):
    """The experiment's result from every chunk's arrays, in prompt order."""
    arrays, s = _concat(parts), header["settings"]
    if header["kind"] == "profile":
        columns = [name[len("records/"):] for name in parts[0] if name.startswith("records/")]
        records = pd.DataFrame({c: arrays[f"records/{c}"] for c in columns})
        return profile_from_records(records, s["residue_modulus"], s["stride"], label=s["label"],
                                    confidence=s["confidence"], interval=s["interval"], n_bootstrap=s["n_bootstrap"],
                                    n_permutations=s["n_permutations"], seed=header["seed"])
    if header["kind"] == "ablate":
        units = pd.DataFrame({"layer": arrays["static/unit_layer"], "kv_head": arrays["static/unit_kv_head"],
                              "heads": [tuple(int(h) for h in json.loads(t)) for t in arrays["static/unit_heads"]]})
        return AblationResult(
            units=units, residue=arrays["residue"], clean_correct=arrays["clean_correct"],
            knockout_correct=arrays["knockout_correct"], residue_modulus=s["residue_modulus"], stride=s["stride"],
            scope=s["result_scope"], model_label=s["label"], n_calibration=s["n_calibration"],
            clean_logit_answer=arrays["clean_logit_answer"], knockout_logit_answer=arrays["knockout_logit_answer"])
    return CyclingResult(shifts=tuple(int(d) for d in arrays["static/shifts"]), residue=arrays["residue"],
                         correct=np.ascontiguousarray(arrays["correct"].T), residue_modulus=s["residue_modulus"],
                         stride=s["stride"], model_label=s["label"], n_boot=s["n_boot"], seed=header["seed"])


def merge(directory: Union[str, os.PathLike]):
    """The result of the run in ``directory`` from its files alone (``run.json`` + every
    ``shards/chunk-*.npz``). Refuses a shard of another run (naming the differing field:
    model hash, task, seed, a setting), an unreadable one, or a missing chunk (naming its
    prompts: rerun the same command to finish them)."""
    directory = check_read_path(directory, f"the --shard-dir of a profile, ablate or cycle run ({RUN_FILE} + "
                                           f"{SHARD_DIR}/)", name="directory")
    run_file = directory / RUN_FILE
    if not run_file.is_file():
        raise UserInputError(f"{run_file} does not exist: {str(directory)!r} is not a sharded run directory")
    header = read_run(run_file)
    n, chunk_size = header["n_prompts"], header["chunk_size"]
    n_chunks = math.ceil(n / chunk_size)
    parts: dict[int, dict] = {}
    for path in sorted((directory / SHARD_DIR).glob("chunk-*.npz")):
        old, chunk, index, arrays = read_shard(path)
        diff = first_difference(header, old)
        if diff:
            raise UserInputError(mismatch(str(path), f"the run in {directory} ({RUN_FILE})", diff))
        expected = re.fullmatch(r"chunk-(\d+)\.npz", path.name)
        if expected is None or int(expected.group(1)) != chunk or not (0 <= chunk < n_chunks) or not np.array_equal(
                index, np.asarray(chunk_range(chunk, chunk_size, n))):
            raise UserInputError(f"{path} holds chunk {chunk} (prompts {index[:1].tolist()}..), which does not fit "
                             f"this run's {n_chunks} chunks of {chunk_size} prompts")
        parts[chunk] = arrays
    missing = [c for c in range(n_chunks) if c not in parts]
    if missing:
        spans = ", ".join(f"{r.start}..{r.stop - 1}" for r in (chunk_range(c, chunk_size, n) for c in missing[:5]))
        raise UserInputError(f"{directory} lacks {len(missing)} of {n_chunks} chunks (prompts {spans}"
                         f"{', ...' if len(missing) > 5 else ''}); rerun the same command to finish them")
    return assemble(header, [parts[c] for c in range(n_chunks)])
