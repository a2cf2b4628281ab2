"""lm-evaluation-harness interop (docs/lm_eval.md): `write_lm_eval_task` writes a model's task as a task
folder that ``lm_eval --include_path DIR --tasks NAME`` runs on any backend; `profile_from_lm_eval` reads
``--log_samples`` output back into a `PhaseProfile`. Scoring is a ``loglikelihood`` request of the one-token
answer, ``acc`` = ``is_greedy``; prompts go as text that the vocabulary's tokenizer encodes back to the ids."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import pandas as pd

from phaseinterp import __version__
from phaseinterp._checks import DEFAULT_N_PER_RESIDUE, check_fraction, check_int, check_seed, check_n_per_residue
from phaseinterp._files import atomic_write_text, check_read_path, check_write_target, write_dir_atomically
from phaseinterp.errors import UserInputError
from phaseinterp.models import loading
from phaseinterp.models.loading import check_source, peek
from phaseinterp.phase import check_residue_modulus
from phaseinterp.profile import check_resampling, profile_from_records
from phaseinterp.tasks import resolve_task
from phaseinterp.tasks.hf_tokenizer import vocab_text

FORMAT = 1  # the ``phaseinterp_format`` field of every prompt: marks a sample as this module's
KIND = "lm-eval task"  # what `phaseinterp._files.saved_kind` calls a written folder
MANIFEST = "lm_eval_task.json"
PROMPTS = "prompts.jsonl"
HELPER = "prompts.py"
TASK_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# lm-eval's samples files: samples_<task>_<date>.jsonl, the date as datetime.isoformat() with ':' -> '-'
SAMPLES_FILE = re.compile(r"^samples_(?P<task>.+)_(?P<date>\d{4}-\d{2}-\d{2}T[0-9.\-]+)\.jsonl$")
# per-prompt fields that only lm-eval needs (the text and ids of the prompt), dropped from the records
PROMPT_FIELDS = ("context", "continuation", "answer_text", "tokens", "phaseinterp_format", "residue_modulus", "stride", "n_prompts")

_HELPER_SOURCE = '''"""The prompts of this lm-evaluation-harness task (written by `phaseinterp lm-eval-task`; do not edit)."""

import json
from pathlib import Path


def load(**_):
    """The ``test`` split: one document per line of prompts.jsonl (lm-eval passes the task's metadata as keywords)."""
    import datasets

    with open(Path(__file__).with_name("prompts.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
'''

_YAML = """# lm-evaluation-harness task written by `phaseinterp lm-eval-task` (phaseinterp {version}); do not edit.
# A prompt is correct when its one-token answer is the model's top-1 next token (acc = is_greedy).
# Run: lm_eval --model hf --model_args pretrained=MODEL_DIR --include_path {folder} --tasks {name} \\
#        --log_samples --output_path OUT
# Read: phaseinterp.profile_from_lm_eval("OUT")
task: {name}
custom_dataset: !function prompts.load
test_split: test
output_type: loglikelihood
doc_to_text: context
doc_to_target: continuation
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: {format}
"""


def default_task_name(label: str) -> str:
    """``phaseinterp_<label>`` with every run of characters outside [A-Za-z0-9] as one ``_``."""
    return "phaseinterp_" + (re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_") or "task")


def _model_task(model: Any, task: Any, stride: Optional[int]) -> tuple[Any, int, str]:
    """(task, stride, label) of ``model``: a zoo name or checkpoint folder (read from its config, no
    weights loaded where the config tells), or a loaded model."""
    described = model
    if isinstance(model, (str, os.PathLike)):
        check_source(model)
        described = peek(model)
        if described is None:  # not readable from config.json alone
            described = loading.load(model)
    task = resolve_task(described, task)
    own = getattr(getattr(described, "cfg", None), "stride", None)
    stride = own if stride is None else stride
    if stride is None:
        raise UserInputError("the model has no cfg.stride; pass stride= explicitly")
    metadata = getattr(described, "metadata", {}) or {}
    label = metadata.get("zoo_name") or getattr(getattr(described, "cfg", None), "label", None)
    if not label:
        label = Path(model).name if isinstance(model, (str, os.PathLike)) else type(model).__name__
    return task, stride, str(label)


def _prompt_rows(batch: Any, vocab: Any, stride: int, name: str) -> list[dict[str, Any]]:
    """One lm-eval document per prompt: the task's metadata row (residue, target_pos, mapping_id, ...)
    plus ``phase``, the prompt's ids up to ``answer_pos`` and their text, the answer's id and word."""
    meta = json.loads(batch.meta.to_json(orient="records"))  # numpy scalars -> JSON values
    rows = []
    for i, row in enumerate(meta):
        pos = int(batch.answer_pos[i])
        ids = [int(t) for t in batch.tokens[i, : pos + 1]]
        answer = int(batch.answer[i])
        rows.append({**row, "prompt_index": i, "phase": int(row["residue"]) % stride, "answer": answer,
                     "answer_pos": pos, "residue_modulus": int(batch.residue_modulus), "stride": int(stride),
                     "n_prompts": len(batch), "lm_eval_task": name, "phaseinterp_format": FORMAT,
                     "answer_text": vocab_text(vocab, [answer]), "context": vocab_text(vocab, ids),
                     "continuation": " " + vocab_text(vocab, [answer]), "tokens": ids})
    return rows


def write_lm_eval_task(model: Any, out: Union[str, os.PathLike], *, n_per_residue: Optional[int] = None,
                       seed: int = 0, task: Any = None, stride: Optional[int] = None, name: Optional[str] = None,
                       overwrite: bool = False) -> Path:
    """Write ``model``'s task as an lm-evaluation-harness task folder ``out``; returns its path.

    ``model``: a zoo name, a checkpoint folder or a loaded model; it supplies the task, the stride and the
    default ``name`` (``phaseinterp_<label>``), each overridable. The prompts are
    ``task.generate(n_per_residue, seed)``.

    The folder holds ``<name>.yaml`` (``output_type: loglikelihood``, metric ``acc``), ``prompts.jsonl``
    (one document per prompt: metadata, ``phase``, ``prompt_index``, ``answer_pos``, the answer, the ids
    ``tokens[: answer_pos + 1]``, their text ``context`` and the continuation ``" " + word``),
    ``prompts.py`` (the loader) and ``lm_eval_task.json`` (provenance). Written atomically; a folder
    holding anything else is refused, a previous task folder replaced only with ``overwrite=True``."""
    target = check_write_target(out, KIND, overwrite=overwrite, name="out")
    if name is not None and (not isinstance(name, str) or not TASK_NAME.match(name)):
        raise UserInputError(f"name={name!r} is not an lm-eval task name this writes (a letter, then letters, "
                             "digits and '_')")
    n_per_residue = DEFAULT_N_PER_RESIDUE if n_per_residue is None else n_per_residue
    seed = check_seed("seed", seed)
    task, stride, label = _model_task(model, task, stride)
    stride = check_int("stride", stride, 1)
    if not hasattr(task, "generate"):
        raise UserInputError(f"task={task!r} has no .generate(n_per_residue, seed); pass a phaseinterp task "
                             "(e.g. KeyValueRetrieval)")
    vocab = getattr(task, "vocab", None)
    if vocab is None:
        raise UserInputError(f"task {type(task).__name__} has no synthetic vocabulary (.vocab): its prompts have "
                             "no text that a tokenizer maps back to the same ids")
    check_residue_modulus(task.residue_modulus, stride)
    check_n_per_residue(n_per_residue, task.residue_modulus)
    name = name or default_task_name(label)
    batch = task.generate(n_per_residue, seed=seed)
    rows = _prompt_rows(batch, vocab, stride, name)
    manifest = {"format": FORMAT, "task_name": name, "model": label, "n_per_residue": n_per_residue, "seed": seed,
                "stride": stride, "residue_modulus": int(batch.residue_modulus), "n_prompts": len(batch),
                "task": task.to_dict() if hasattr(task, "to_dict") else None, "phaseinterp_version": __version__,
                "prompt_text": "the task's words joined by single spaces (phaseinterp.tasks.hf_tokenizer.vocab_text)"}

    def write(folder: Path) -> None:
        atomic_write_text(folder / PROMPTS, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        atomic_write_text(folder / HELPER, _HELPER_SOURCE)
        atomic_write_text(folder / f"{name}.yaml", _YAML.format(version=__version__, folder=target, name=name,
                                                                format=FORMAT))
        atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")

    return write_dir_atomically(target, write)


# ------------------------------------------------------------------ reading lm-eval's samples
def _first_doc(path: Path) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline()
        doc = json.loads(line).get("doc")
    except (OSError, ValueError, AttributeError):
        return None
    return doc if isinstance(doc, dict) else None


def _is_ours(path: Path) -> bool:
    doc = _first_doc(path)
    return doc is not None and doc.get("phaseinterp_format") == FORMAT


def find_samples(path: Union[str, os.PathLike], *, task_name: Optional[str] = None) -> Path:
    """The one lm-eval samples file (``samples_<task>_<date>.jsonl``, possibly in a model-named subfolder)
    of a phaseinterp task under ``path`` (or ``path`` itself, a samples file). ``task_name``: the task
    expected (default: the one phaseinterp task found). A missing path, a folder without samples, samples
    of other tasks only, or several files that fit are each a `UserInputError` in one line."""
    path = check_read_path(path, "lm-eval's --output_path folder (or one samples_<task>_<date>.jsonl file in it)",
                           name="output_dir", expect="any")
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("samples_*.jsonl") if SAMPLES_FILE.match(p.name))
        if not files:
            raise UserInputError(f"output_dir={str(path)!r} holds no lm-eval samples (samples_<task>_<date>.jsonl); "
                                 f"run lm_eval with --log_samples --output_path {path}")
    tasks = {p: (SAMPLES_FILE.match(p.name).group("task") if SAMPLES_FILE.match(p.name) else None) for p in files}
    if task_name is not None:
        fitting = [p for p in files if tasks[p] == task_name or tasks[p] is None]
        if not fitting:
            found = sorted({t for t in tasks.values() if t})
            raise UserInputError(f"output_dir={str(path)!r} holds lm-eval samples of task(s) {found}, not of the "
                                 f"expected task {task_name!r}")
    else:
        fitting = files
    ours = [p for p in fitting if _is_ours(p)]
    if not ours:
        found = sorted({tasks[p] or p.name for p in fitting})
        expected = repr(task_name) if task_name else "a task written by `phaseinterp lm-eval-task`"
        raise UserInputError(f"output_dir={str(path)!r} holds lm-eval samples of task(s) {found}, not of {expected} "
                             f"(their documents have no phaseinterp_format={FORMAT} field)")
    if len(ours) > 1:
        names = sorted({tasks[p] for p in ours})
        if task_name is None and len(names) > 1:
            raise UserInputError(f"output_dir={str(path)!r} holds samples of several phaseinterp tasks {names}; "
                                 "pass task_name=")
        listed = ", ".join(str(p) for p in ours[:3]) + (", ..." if len(ours) > 3 else "")
        raise UserInputError(f"output_dir={str(path)!r} holds {len(ours)} samples files of task {names[0]!r} "
                             f"(several runs: {listed}); pass one of them as the path")
    return ours[0]


def _model_name(samples: Path) -> Optional[str]:
    """The model lm-eval ran, from the results file of the same run beside the samples (None if absent)."""
    match = SAMPLES_FILE.match(samples.name)
    if match is None:
        return None
    try:
        results = json.loads((samples.parent / f"results_{match.group('date')}.json").read_text())
    except (OSError, ValueError):
        return None
    name = results.get("model_name") if isinstance(results, dict) else None
    return str(name) if name else None


def read_samples(path: Union[str, os.PathLike], *, task_name: Optional[str] = None) -> tuple[Any, dict[str, Any]]:
    """(records, info) from lm-eval's logged samples of a phaseinterp task (`find_samples`): one row per
    prompt, sorted by ``prompt_index``, with the task's metadata columns, ``phase``, ``answer``, ``correct``
    (lm-eval's ``acc``: the answer was the top-1 next token) and ``answer_logprob``; ``info`` holds the
    file, task name, R, S, the model name lm-eval reported and the prompts expected."""
    samples = find_samples(path, task_name=task_name)
    rows = []
    with open(samples, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
                doc = sample["doc"]
                acc = sample["acc"]
            except (ValueError, KeyError, TypeError):
                raise UserInputError(f"{samples}: line {number} is not an lm-eval sample with 'doc' and 'acc' "
                                     "(the task's metric list must keep acc)") from None
            try:
                logprob = float(sample["filtered_resps"][0][0])
            except (KeyError, IndexError, TypeError, ValueError):
                logprob = float("nan")
            record = {k: v for k, v in doc.items() if k not in PROMPT_FIELDS}
            record.update(correct=bool(acc), answer_logprob=logprob, doc_id=sample.get("doc_id"))
            rows.append((doc, record))
    if not rows:
        raise UserInputError(f"{samples} holds no samples")
    first = rows[0][0]
    modulus, stride, expected = int(first["residue_modulus"]), int(first["stride"]), int(first["n_prompts"])
    records = pd.DataFrame([r for _, r in rows]).sort_values("prompt_index").reset_index(drop=True)
    if records["prompt_index"].duplicated().any():
        raise UserInputError(f"{samples} holds some prompts more than once")
    if len(records) != expected:
        raise UserInputError(f"{samples} holds {len(records)} of the task's {expected} prompts (lm_eval --limit?); "
                             "a phase profile needs every residue group: run the whole task")
    residues = records["residue"].to_numpy()
    if residues.min() < 0 or residues.max() >= modulus or not np.array_equal(records["phase"], residues % stride):
        raise UserInputError(f"{samples}: residues must lie in 0..{modulus - 1} with phase = residue mod {stride}")
    info = {"file": samples, "task_name": SAMPLES_FILE.match(samples.name).group("task")
            if SAMPLES_FILE.match(samples.name) else first.get("lm_eval_task"),
            "modulus": modulus, "stride": stride, "n_prompts": expected, "model_name": _model_name(samples)}
    return records, info


def profile_from_lm_eval(path: Union[str, os.PathLike], *, task_name: Optional[str] = None,
                         label: Optional[str] = None, confidence: float = 0.95, interval: str = "auto",
                         n_bootstrap: int = 2000, n_permutations: int = 1999, seed: int = 0) -> Any:
    """A `PhaseProfile` from lm-eval's logged samples of a task written by `write_lm_eval_task`,
    aggregated as `phase_profile` does. ``path``: the output folder or one samples file; ``label`` defaults
    to lm-eval's model and the task name; the other options are `phase_profile`'s."""
    confidence = check_fraction("confidence", confidence)  # before the samples are read
    check_resampling(n_bootstrap, n_permutations, seed)
    records, info = read_samples(path, task_name=task_name)
    if label is None:
        model = Path(info["model_name"]).name if info["model_name"] else info["file"].parent.name
        label = f"{model} (lm-eval {info['task_name']})"
    return profile_from_records(records, info["modulus"], info["stride"], label=label, confidence=confidence,
                                interval=interval, n_bootstrap=n_bootstrap, n_permutations=n_permutations, seed=seed)


__all__ = ["find_samples", "profile_from_lm_eval", "read_samples", "write_lm_eval_task"]
