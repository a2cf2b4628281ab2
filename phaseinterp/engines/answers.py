"""The answers a phase profile needs, asked of an engine (`engine_answers`): prompts as token ids cut at the
answer position, bounded retries with backoff, and a journal of finished batches to resume from.
The prediction is the argmax of the reported log-probs (whole vocabulary or top-k, the others ``NaN``;
ties to the lowest id); with top-k an answer outside the reported k is wrong, ``answer_logprob`` ``NaN``."""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from phaseinterp._checks import check_int, check_real
from phaseinterp.errors import EngineError, UserInputError
from phaseinterp._files import atomic_write, check_output_dir, json_default, progress_bar, saved_kind

JOURNAL_FORMAT = "phaseinterp-engine-answers/1"
JOURNAL_FILE = "run.json"
BATCH_DIR = "answers"
MAX_WAIT = 60.0  # seconds: the longest pause between two tries of one batch


@dataclass(frozen=True)
class EngineAnswers:
    """Per prompt (prompt order): the engine's top-1 among what it reported (``predicted``), the
    reported log-prob of the answer (``answer_logprob``, ``NaN`` when not reported) and how many
    log-probs it reported (``n_reported``: the vocabulary size, or its top-k)."""

    predicted: np.ndarray
    answer_logprob: np.ndarray
    n_reported: np.ndarray


def prompts_sha256(batch: Any) -> str:
    """SHA-256 of the prompts' token ids, answers and answer positions: a journal resumes only the
    same prompts."""
    h = hashlib.sha256()
    for t in (batch.tokens, batch.answer, batch.answer_pos):
        h.update(t.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


def check_engine(engine: Any) -> str:
    """The engine's name; a `UserInputError` unless it is a callable `Engine` with a ``name``."""
    name = getattr(engine, "name", None)
    if not callable(engine) or not isinstance(name, str) or not name:
        raise UserInputError(f"engine={engine!r} is not an Engine: a callable tokens [batch, pos] -> next-token "
                             "log-probs [batch, d_vocab] with a non-empty .name (e.g. phaseinterp.engines.OpenAIEngine)")
    return name


def check_ids_fit(batch: Any, d_vocab: Optional[int], what: str) -> None:
    """Every token id the prompts hold and every answer id lies in ``0..d_vocab-1``: else the task
    was laid out with another vocabulary than the engine's (a `UserInputError`, before any request)."""
    if d_vocab is None:
        return
    top = max(int(batch.tokens.max()), int(batch.answer.max()))
    low = min(int(batch.tokens.min()), int(batch.answer.min()))
    if low < 0 or top >= d_vocab:
        bad = low if low < 0 else top
        raise UserInputError(f"token id {bad} of the task is out of range for {what}'s d_vocab={d_vocab} "
                             f"(0..{d_vocab - 1}): the task's tokenizer is not the served model's")


def _journal_header(name: str, batch: Any, batch_size: int) -> dict[str, Any]:
    return {"format": JOURNAL_FORMAT, "engine": name, "n_prompts": len(batch), "batch_size": batch_size,
            "prompts_sha256": prompts_sha256(batch), "task": getattr(batch, "task", None)}


def _batch_path(directory: Path, start: int) -> Path:
    return directory / BATCH_DIR / f"batch-{start:07d}.npz"


def _write_batch(path: Path, rows: range, part: EngineAnswers) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, start=np.array(rows.start), stop=np.array(rows.stop), predicted=part.predicted,
             answer_logprob=part.answer_logprob, n_reported=part.n_reported)
    atomic_write(path, buffer.getvalue())


def _read_batch(path: Path, rows: range) -> Optional[EngineAnswers]:
    """The answers of one finished batch; ``None`` (with a warning) for a torn file, which is asked again.
    A whole file of other prompts is another run's: refused."""
    try:
        with np.load(path, allow_pickle=False) as data:
            span = (int(data["start"]), int(data["stop"]))
            part = EngineAnswers(data["predicted"], data["answer_logprob"], data["n_reported"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        warnings.warn(f"{path} is torn ({type(err).__name__}: {err}); it is dropped and its prompts "
                      f"{rows.start}..{rows.stop - 1} are asked again", stacklevel=3)
        path.unlink(missing_ok=True)
        return None
    if span != (rows.start, rows.stop) or len(part.predicted) != len(rows):
        raise UserInputError(f"{path} holds prompts {span[0]}..{span[1] - 1}, not {rows.start}..{rows.stop - 1}")
    return part


def _drop_torn_writes(directory: Path) -> None:
    """Remove the hidden temporaries of batch writes a stopped run left (`atomic_write` names them
    ``.batch-NNNNNNN.npz.*.tmp``): never a finished batch, never a file of anyone else's."""
    for tmp in (directory / BATCH_DIR).glob(".batch-*.npz.*.tmp"):
        tmp.unlink(missing_ok=True)


def _open_journal(directory: Union[str, Path], header: dict[str, Any]) -> Path:
    """The journal folder ``directory``, new or of the same run (`engine_answers`). Refused: a folder
    of anything else (a user's files, a saved result), and a journal of another run (another
    engine/model name, task, prompts or batch size), naming the field that differs."""
    directory = check_output_dir(directory, name="resume_dir")
    run = directory / JOURNAL_FILE
    held = saved_kind(directory)
    if held is not None and not run.is_file():
        if held == "file":
            raise UserInputError(f"resume_dir={str(directory)!r} is an existing file, not a folder")
        entries = sorted(p.name for p in directory.iterdir())
        raise UserInputError(
            f"resume_dir={str(directory)!r} is not an engine-answers journal (it holds {held}: "
            f"{', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''}; no {JOURNAL_FILE}); pass a new or "
            "empty folder, or the folder of an earlier run to resume it")
    if run.is_file():
        try:
            old = json.loads(run.read_text())
        except (OSError, ValueError) as err:
            raise UserInputError(f"{run} is not a readable answers journal ({err})") from None
        mine = json.loads(json.dumps(header, default=json_default))
        for key in header:
            if not isinstance(old, dict) or old.get(key) != mine.get(key):
                theirs = old.get(key, "<missing>") if isinstance(old, dict) else "<not a journal>"
                raise UserInputError(
                    f"resume_dir={str(directory)!r} holds the answers of another run: field {key!r} differs "
                    f"({str(mine.get(key))[:60]} here vs {str(theirs)[:60]} there); use a new folder, or the "
                    "same engine name, prompts and batch_size")
    (directory / BATCH_DIR).mkdir(parents=True, exist_ok=True)
    _drop_torn_writes(directory)
    if not run.is_file():
        atomic_write(run, json.dumps(header, indent=2, sort_keys=True, default=json_default).encode())
    return directory


NORMALIZATION_SLACK = 1e-2  # a row's reported probabilities may sum to at most 1 + this (float rounding)
TOP_K_SLACK = math.log(2.0)  # ... and to at least k / d_vocab over this factor's exp (2: low-precision servers)


def check_logprob_rows(logprobs: torch.Tensor, who: str, first: int = 0) -> None:
    """Log-probabilities a model can give: each reported value is +inf-free and <= 0, and each row's
    reported probabilities sum to at most 1 and at least ``k / d_vocab`` for ``k`` reported (halved for
    rounding). Names the first prompt and token that break it."""
    reported = ~torch.isnan(logprobs)
    bad = reported & (torch.isposinf(logprobs) | (logprobs > NORMALIZATION_SLACK))
    if bool(bad.any()):
        row, token = (int(i) for i in torch.nonzero(bad)[0])
        raise UserInputError(f"{who} returned log-prob {float(logprobs[row, token])} for token {token} of prompt "
                             f"{first + row}: a log-probability is <= 0 (finite, or -inf for probability 0)")
    total = torch.logsumexp(torch.where(reported, logprobs, torch.tensor(float("-inf"))), dim=1)
    over = total > math.log1p(NORMALIZATION_SLACK)
    if bool(over.any()):
        row = int(torch.nonzero(over)[0])
        raise UserInputError(f"{who} returned log-probs for prompt {first + row} whose probabilities sum to "
                             f"{math.exp(float(total[row])):.4g} > 1: not a distribution (raw logits instead of "
                             "log-probs?)")
    n_reported = reported.sum(dim=1)
    floor = torch.log(n_reported.clamp(min=1).double() / logprobs.shape[1]) - TOP_K_SLACK
    under = (n_reported > 0) & (total.double() < floor)
    if bool(under.any()):
        row = int(torch.nonzero(under)[0])
        raise UserInputError(f"{who} returned log-probs for prompt {first + row} whose probabilities sum to "
                             f"{math.exp(float(total[row])):.4g}, below {int(n_reported[row])}/{logprobs.shape[1]} "
                             "(the least the most probable tokens of any distribution carry): not a distribution's "
                             "top log-probs")


def check_logprobs(out: Any, n: int, name: Any) -> torch.Tensor:
    """``out`` as float32 log-probs on the CPU if it is a ``[n, d_vocab]`` tensor; else a `UserInputError`
    naming engine ``name``."""
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != n:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserInputError(f"engine {name!r} returned {shape} for {n} prompts; expected next-token log-probs "
                             f"[{n}, d_vocab]")
    return out.detach().float().cpu()


def _read_answers(logprobs: Any, answer: torch.Tensor, d_vocab: Optional[int], name: str,
                  first: int) -> EngineAnswers:
    """One call's log-probs -> the per-prompt answers (checked: shape, at least one reported value)."""
    logprobs = check_logprobs(logprobs, len(answer), name)
    width = logprobs.shape[1]
    if d_vocab is not None and width != d_vocab:
        raise UserInputError(f"engine {name!r} returned rows of {width} log-probs; its d_vocab is {d_vocab}")
    if int(answer.max()) >= width:
        raise UserInputError(f"answer id {int(answer.max())} is out of range for engine {name!r}'s {width} "
                             f"log-probs (0..{width - 1}): the task's tokenizer is not the served model's")
    reported = ~torch.isnan(logprobs)
    n_reported = reported.sum(dim=1)
    if bool((n_reported == 0).any()):
        row = first + int(torch.nonzero(n_reported == 0)[0])
        raise UserInputError(f"engine {name!r} reported no log-probs for prompt {row}: it must report the top-1 "
                             "or more (top-k log-probs) for every prompt")
    check_logprob_rows(logprobs, f"engine {name!r}", first)
    predicted = torch.where(reported, logprobs, torch.tensor(float("-inf"))).argmax(dim=1)
    answer_logprob = logprobs[torch.arange(len(answer)), answer]
    return EngineAnswers(predicted.numpy().astype(np.int64), answer_logprob.numpy().astype(np.float32),
                         n_reported.numpy().astype(np.int64))


def _ask(engine: Callable, batch: Any, rows: range, d_vocab: Optional[int], name: str) -> EngineAnswers:
    """One batch of prompts: each prompt cut after its answer position (rows of one call share a length)."""
    pos = batch.answer_pos[rows.start:rows.stop]
    answer = batch.answer[rows.start:rows.stop]
    predicted = np.empty(len(rows), dtype=np.int64)
    answer_logprob = np.empty(len(rows), dtype=np.float32)
    n_reported = np.empty(len(rows), dtype=np.int64)
    for p in torch.unique(pos).tolist():
        local = torch.nonzero(pos == p).flatten()
        tokens = batch.tokens[rows.start + local, : p + 1]
        part = _read_answers(engine(tokens), answer[local], d_vocab, name, rows.start + int(local[0]))
        predicted[local.numpy()] = part.predicted
        answer_logprob[local.numpy()] = part.answer_logprob
        n_reported[local.numpy()] = part.n_reported
    return EngineAnswers(predicted, answer_logprob, n_reported)


def engine_answers(
    engine: Callable,
    batch: Any,
    *,
    batch_size: int = 64,
    resume_dir: Union[str, Path, None] = None,
    retries: int = 3,
    retry_wait: float = 1.0,
    progress: bool = True,
) -> EngineAnswers:
    """Ask ``engine`` for every prompt of ``batch`` (a `TaskBatch`), ``batch_size`` prompts per call.

    Prompt ``i`` goes as ``batch.tokens[i, :answer_pos[i] + 1]``. A call raising `EngineError` or
    ``OSError`` is tried again up to ``retries`` times, waiting ``retry_wait * 2**k`` seconds (at most 60)
    before try ``k + 1``; then an `EngineError` says how many answers were kept. Other errors are not
    retried and are raised with the same count.

    ``resume_dir``: a journal folder (``run.json`` naming the engine, task, prompts' SHA-256 and
    ``batch_size``; ``answers/batch-NNNNNNN.npz`` per finished call, each written atomically). A rerun
    asks only for the missing batches; a torn batch file is asked again; a journal of another run, or a
    folder that is not a journal, is refused naming the field."""
    name = check_engine(engine)
    batch_size = check_int("batch_size", batch_size, 1, why=" (prompts per engine call)")
    retries = check_int("retries", retries, 0, why=" (further tries of a failing batch)")
    retry_wait = check_real("retry_wait", retry_wait, 0.0, why=" (seconds between tries)")
    d_vocab = getattr(engine, "d_vocab", None)
    check_ids_fit(batch, d_vocab, f"engine {name!r}")
    n = len(batch)
    directory = None if resume_dir is None else _open_journal(resume_dir, _journal_header(name, batch, batch_size))
    grid = [range(start, min(start + batch_size, n)) for start in range(0, n, batch_size)]
    done: dict[int, EngineAnswers] = {}
    if directory is not None:
        for rows in grid:
            path = _batch_path(directory, rows.start)
            part = _read_batch(path, rows) if path.is_file() else None
            if part is not None:
                done[rows.start] = part

    def kept() -> str:
        count = sum(len(part.predicted) for part in done.values())
        if directory is None:
            return (f"{count} of {n} answers had been received and are not kept: pass resume_dir=DIR (CLI: "
                    "--shard-dir DIR) to keep every finished batch and resume from it")
        return (f"{count} of {n} answers are kept in {str(directory)!r}: rerun with the same resume_dir (CLI: "
                "--shard-dir) to ask only for the rest")

    bar = progress_bar(progress and len(grid) > 1, len(grid), f"phase profile ({name})", initial=len(done))
    try:
        for rows in grid:
            if rows.start in done:
                continue
            for attempt in range(retries + 1):
                try:
                    part = _ask(engine, batch, rows, d_vocab, name)
                    break
                except (EngineError, OSError) as err:
                    if attempt == retries:
                        raise EngineError(f"engine {name!r} failed on prompts {rows.start}..{rows.stop - 1} "
                                          f"{retries + 1} times (last: {err}); {kept()}") from err
                    time.sleep(min(MAX_WAIT, retry_wait * 2 ** attempt))
                except UserInputError as err:
                    raise UserInputError(f"{err}; {kept()}") from err
            if directory is not None:
                _write_batch(_batch_path(directory, rows.start), rows, part)
            done[rows.start] = part
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    parts = [done[rows.start] for rows in grid]
    return EngineAnswers(*(np.concatenate([getattr(p, f) for p in parts])
                           for f in ("predicted", "answer_logprob", "n_reported")))


__all__ = ["EngineAnswers", "check_engine", "check_ids_fit", "engine_answers", "prompts_sha256"]
