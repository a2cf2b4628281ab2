"""Controlled pretraining on CPU: ``train(config, task, steps=...)`` trains a `CompressedTransformer` from
scratch (AdamW, warm-up + cosine decay, clipping), every batch seeded by ``(seed, step)`` so a resumed run
reproduces the uninterrupted one; curricula (`CurriculumStage`) and task mixtures (periodic rows)."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Int
from torch import Tensor

from phaseinterp._checks import check_device, check_int
from phaseinterp._files import atomic_write, check_read_path, check_write_target, normal_mode, progress_bar
from phaseinterp.config import CompressedConfig
from phaseinterp.errors import UserInputError
from phaseinterp.models.transformer import CompressedTransformer
from phaseinterp.phase import check_residue_modulus
from phaseinterp.results import plotting

STATE_FILE = "train_state.json"
OPTIMIZER_FILE = "optimizer.pt"
CURVES_FILE = "curves.csv"
LOG_FILE = "log.csv"


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass(frozen=True)
class CurriculumStage:
    """Task knobs in force until ``until`` (a fraction of the run, 0 < until <= 1)."""

    until: float
    task: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (0 < self.until <= 1):
            raise UserInputError(f"CurriculumStage.until={self.until} must be in (0, 1]")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run besides the model and the task."""

    steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    loss_on: str = "answer"  # "answer" | "values"
    periodic_fraction: float = 0.0
    periodic_block: tuple[int, int] = (2, 8)
    curriculum: tuple[Union[CurriculumStage, dict], ...] = ()  # dicts become CurriculumStage (__post_init__)
    eval_every: int = 100
    checkpoint_every: int = 100
    probe_per_residue: int = 8
    probe_seed: int = 12345
    snapshot_steps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "checkpoint_every", "probe_per_residue"):
            check_int(name, getattr(self, name), 1)
        if not (self.lr > 0):
            raise UserInputError(f"lr={self.lr} must be > 0")
        if self.loss_on not in ("answer", "values"):
            raise UserInputError(f"loss_on={self.loss_on!r} is not one of ('answer', 'values')")
        if not (0 <= self.periodic_fraction < 1):
            raise UserInputError(f"periodic_fraction={self.periodic_fraction} must be in [0, 1)")
        lo, hi = self.periodic_block
        if not (1 <= lo <= hi):
            raise UserInputError(f"periodic_block={self.periodic_block} must satisfy 1 <= min <= max")
        stages = [CurriculumStage(**s) if isinstance(s, dict) else s for s in self.curriculum]
        object.__setattr__(self, "curriculum", tuple(stages))
        object.__setattr__(self, "betas", tuple(self.betas))
        object.__setattr__(self, "periodic_block", tuple(self.periodic_block))
        object.__setattr__(self, "snapshot_steps", tuple(self.snapshot_steps))
        if any(b.until <= a.until for a, b in zip(stages, stages[1:])):
            raise UserInputError("curriculum stages must have strictly increasing `until`")
        if not (0 <= self.warmup_steps):
            raise UserInputError(f"warmup_steps={self.warmup_steps} must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise UserInputError(f"unknown TrainConfig fields {sorted(unknown)}")
        return cls(**d)

    def stage_at(self, step: int) -> dict[str, Any]:
        """Task knobs at ``step`` (the first stage whose ``until`` lies beyond it; {} after)."""
        frac = step / self.steps
        for stage in self.curriculum:
            if frac < stage.until:
                return dict(stage.task)
        return {}

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)


@dataclass(frozen=True)
class TrainResult:
    """A finished (or stopped) run: the model, its logs and where they live."""

    model: CompressedTransformer
    out_dir: Optional[Path]
    log: pd.DataFrame  # step, loss, accuracy, lr, seconds
    curves: pd.DataFrame  # step, residue, phase, accuracy, n (held-out probe)

    def plot(self):
        return plotting().training_curves(self.curves, self.log)


def periodic_rows(
    n: int, seq_len: int, vocab_size: int, block: tuple[int, int], generator: torch.Generator, low: int = 0
) -> tuple[Int[Tensor, "n pos"], Int[Tensor, "n pos"], Bool[Tensor, "n pos"]]:
    """Rows of a random ``block``-token pattern repeated to fill ``seq_len``.

    Returns ``(tokens, targets, mask)`` with ``targets[t] = tokens[t + 1]`` and the loss
    mask on every position whose next token is determined by the pattern (``t >= b - 1``).
    """
    lengths = torch.randint(block[0], block[1] + 1, (n,), generator=generator)
    tokens = torch.empty(n, seq_len, dtype=torch.long)
    mask = torch.zeros(n, seq_len, dtype=torch.bool)
    for i, b in enumerate(lengths.tolist()):
        pattern = torch.randint(low, vocab_size, (b,), generator=generator)
        tokens[i] = pattern.repeat(seq_len // b + 1)[:seq_len]
        mask[i, b - 1 : seq_len - 1] = True
    targets = torch.roll(tokens, -1, dims=1)
    return tokens, targets, mask


def _batch(task, train_cfg: TrainConfig, step: int, seq_len: int, vocab_size: int):
    """The batch of ``step``: a pure function of (seed, step), which makes resume exact."""
    step_seed = train_cfg.seed * 1_000_003 + step
    gen = torch.Generator().manual_seed(step_seed)
    n_periodic = int(round(train_cfg.periodic_fraction * train_cfg.batch_size))
    n_task = train_cfg.batch_size - n_periodic
    rows = task.sample_train(n_task, step_seed, **train_cfg.stage_at(step))
    mask = rows.value_mask if train_cfg.loss_on == "values" else rows.answer_mask
    tokens, targets = rows.tokens, rows.targets
    if n_periodic:
        p_tok, p_tgt, p_mask = periodic_rows(
            n_periodic, seq_len, vocab_size, train_cfg.periodic_block, gen, low=len(task.vocab.specials)
        )
        tokens, targets, mask = torch.cat([tokens, p_tok]), torch.cat([targets, p_tgt]), torch.cat([mask, p_mask])
    return tokens, targets, mask, n_task


def _probe_curves(model, probe, device, stride: int, step: int) -> list[dict]:
    """Accuracy per residue on the fixed held-out probe set."""
    model.eval()
    correct = []
    with torch.inference_mode():
        for i in range(0, probe.tokens.shape[0], 256):
            logits = model(probe.tokens[i : i + 256].to(device))
            pred = logits[torch.arange(logits.shape[0]), probe.answer_pos[i : i + 256].to(device)].argmax(-1)
            correct.append((pred.cpu() == probe.answer[i : i + 256]))
    correct = torch.cat(correct).float()
    frame = pd.DataFrame({"residue": probe.meta["residue"].to_numpy(), "correct": correct.numpy()})
    rows = []
    for r, grp in frame.groupby("residue"):
        rows.append(dict(step=step, residue=int(r), phase=int(r) % stride, accuracy=float(grp.correct.mean()), n=int(len(grp))))
    return rows


def train(
    config: CompressedConfig,
    task,
    *,
    steps: Optional[int] = None,
    batch_size: Optional[int] = None,
    lr: Optional[float] = None,
    train_config: Optional[TrainConfig] = None,
    seed: Optional[int] = None,
    device: Optional[Union[str, torch.device]] = None,
    out_dir: Optional[Union[str, Path]] = None,
    resume: bool = False,
    progress: bool = True,
    stop_after: Optional[int] = None,
    metadata: Optional[dict] = None,
    init_from: Optional[Union[str, Path]] = None,
) -> TrainResult:
    """Train ``config`` from scratch on ``task`` (module docstring).

    ``train_config`` holds every setting; ``steps``, ``batch_size``, ``lr`` and ``seed`` override it. With
    ``out_dir`` the run writes ``checkpoints/step_N/`` every ``checkpoint_every`` steps, ``snapshot_<step>/``
    at ``snapshot_steps``, ``log.csv`` and ``curves.csv``; ``resume=True`` continues from the latest (or
    starts fresh when there is none). ``stop_after`` ends early. ``init_from`` (a saved model folder of the
    same architecture, recorded in the metadata) starts from its weights with a fresh optimizer.

    Refused before any step (ValueError naming the value): a ``config.stride`` not dividing the task's
    residue modulus R, a vocabulary or context too small for the task, a device this machine lacks, and a
    resume whose architecture, recipe (``steps`` included) or task differs."""
    tc = train_config or TrainConfig()
    overrides = {k: v for k, v in dict(steps=steps, batch_size=batch_size, lr=lr, seed=seed).items() if v is not None}
    tc = dataclasses.replace(tc, **overrides)
    if config.d_vocab < task.vocab.size:
        raise UserInputError(f"config.d_vocab={config.d_vocab} is smaller than the task vocabulary ({task.vocab.size})")
    if config.n_ctx < task.seq_len:
        raise UserInputError(f"config.n_ctx={config.n_ctx} is shorter than the task's seq_len={task.seq_len}")
    if resume and out_dir is None:
        raise UserInputError("resume=True needs out_dir")
    R = getattr(task, "residue_modulus", None)
    if R is not None:
        check_residue_modulus(R, config.stride)  # else the trained model could not be profiled by phase
    if device is not None:
        check_device(device)
    device = torch.device(device) if device is not None else torch.device("cpu")
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:  # a previous run is continued only with resume=True; nothing else is written over
        out = check_write_target(out, "training run", overwrite=resume, name="out_dir",
                                 flag="resume=True (CLI: --resume) to continue it")
    ckpt = out / "checkpoints" if out is not None else None

    model = CompressedTransformer(config.replace(seed=tc.seed)).to(device)
    if init_from is not None:
        _init_weights(model, check_read_path(init_from, "a saved model folder (config.json + weights), e.g. a zoo "
                                                        "checkpoint", name="init_from"))
        metadata = {"init_from": str(init_from), **(metadata or {})}
    optimizer = _make_optimizer(model, tc)
    start, log_rows, curve_rows = 0, [], []
    if resume and ckpt is not None and latest_checkpoint(ckpt) is not None:
        model, optimizer, start, log_rows, curve_rows = _load_checkpoint(latest_checkpoint(ckpt), tc, device)
        _check_same_run(model, config.replace(seed=tc.seed), tc, task, start, ckpt)
    run_meta = {
        "train_config": tc.to_dict(),
        "task": task.to_dict() if hasattr(task, "to_dict") else repr(task),
        "task_type": type(task).__name__,
        **(metadata or {}),
    }
    model.metadata.update(run_meta)

    stride = config.stride
    probe = task.generate(tc.probe_per_residue, seed=tc.probe_seed, strict=False)
    end = tc.steps if stop_after is None else min(tc.steps, start + stop_after)
    bar = progress_bar(progress, tc.steps, "train", initial=start, leave=True)
    t0 = time.time()
    step = start
    updating = False  # True while parameters may be half-updated
    try:
        for step in range(start, end):
            model.train()
            tokens, targets, mask, n_task = _batch(task, tc, step, task.seq_len, task.vocab.size)
            tokens, targets, mask = tokens.to(device), targets.to(device), mask.to(device)
            for group in optimizer.param_groups:
                group["lr"] = tc.lr_at(step)
            logits = model(tokens)
            loss = F.cross_entropy(logits[mask], targets[mask])
            if not torch.isfinite(loss):
                raise TrainingDiverged(
                    f"loss became {loss.item()} at step {step}; "
                    + (f"the last good checkpoint is {ckpt}" if ckpt is not None else "no checkpoint was written")
                )
            updating = True
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optimizer.step()
            with torch.no_grad():
                task_mask = mask[:n_task]
                acc = (logits[:n_task].argmax(-1)[task_mask] == targets[:n_task][task_mask]).float().mean().item()
            log_rows.append(dict(step=step + 1, loss=loss.item(), accuracy=acc, lr=tc.lr_at(step),
                                 seconds=time.time() - t0))
            updating = False
            done = step + 1
            if done % tc.eval_every == 0 or done == tc.steps:
                curve_rows.extend(_probe_curves(model, probe, device, stride, done))
            if bar is not None:
                recent = log_rows[-20:]
                bar.set_postfix(loss=f"{sum(r['loss'] for r in recent) / len(recent):.3f}",
                                acc=f"{sum(r['accuracy'] for r in recent) / len(recent):.2f}")
                bar.update(1)
            if out is not None and done in tc.snapshot_steps:
                model.eval()
                model.save_pretrained(out / f"snapshot_{done:06d}", metadata={"step": done},
                                      overwrite=resume)  # a resumed run writes the same step again
            if ckpt is not None and (done % tc.checkpoint_every == 0 or done == end):
                _save_checkpoint(ckpt, model, optimizer, done, log_rows, curve_rows)
    except KeyboardInterrupt:
        # Completed steps are saved unless the interrupt hit mid-update (then the last
        # periodic checkpoint, written atomically, is the state to resume from).
        if ckpt is not None and log_rows and not updating and log_rows[-1]["step"] > start:
            _save_checkpoint(ckpt, model, optimizer, log_rows[-1]["step"], log_rows, curve_rows)
        raise
    finally:
        if bar is not None:
            bar.close()
    model.eval()
    log, curves = pd.DataFrame(log_rows), pd.DataFrame(curve_rows)
    if out is not None:
        atomic_write(out / LOG_FILE, log.to_csv(index=False).encode())
        atomic_write(out / CURVES_FILE, curves.to_csv(index=False).encode())
    return TrainResult(model=model, out_dir=out, log=log, curves=curves)


def _init_weights(model: CompressedTransformer, folder: Path) -> None:
    """Copy a saved model's weights into ``model`` (post-training), refusing another architecture."""
    if not (folder / "config.json").is_file():
        raise UserInputError(f"init_from={str(folder)!r} is not a saved model folder (no config.json there)")
    source = CompressedTransformer.from_pretrained(folder)
    ignore = {"seed"}
    was = {k: v for k, v in source.cfg.to_dict().items() if k not in ignore}
    now = {k: v for k, v in model.cfg.to_dict().items() if k not in ignore}
    diff = sorted(k for k in set(was) | set(now) if was.get(k) != now.get(k))
    if diff:
        raise UserInputError(f"init_from={str(folder)!r} has "
                             + ", ".join(f"{k}={was.get(k)!r}" for k in diff)
                             + " but the config asks for " + ", ".join(f"{k}={now.get(k)!r}" for k in diff))
    with torch.no_grad():
        model.load_state_dict(source.state_dict())


def _make_optimizer(model, tc: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "W_E" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "W_E" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tc.lr, betas=tc.betas,
    )


def _save_checkpoint(root: Path, model, optimizer, step: int, log_rows, curve_rows) -> None:
    """Write ``root/step_<step>/`` (model, optimizer, state) into a temporary directory, rename
    it into place, then point ``root/LATEST`` at it (atomic write). A crash at any moment
    leaves ``LATEST`` naming a complete checkpoint. The previous checkpoint is kept."""
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{name}."))
    os.chmod(tmp, normal_mode(directory=True))  # mkdtemp's 0o700 would survive the rename
    was_training = model.training
    model.eval()
    model.save_pretrained(tmp, metadata={"step": step})
    model.train(was_training)
    buf = io.BytesIO()
    torch.save(optimizer.state_dict(), buf)
    atomic_write(tmp / OPTIMIZER_FILE, buf.getvalue())
    atomic_write(tmp / STATE_FILE, json.dumps({"step": step, "log": log_rows, "curves": curve_rows}).encode())
    publish_checkpoint(root, tmp, name)


def publish_checkpoint(root: Path, tmp: Path, name: str, *, keep_every: Optional[int] = None) -> None:
    """Rename the complete checkpoint folder ``tmp`` to ``root/name``, point ``root/LATEST`` at it
    (atomic write) and delete every older ``step_*`` but the previous one and, with ``keep_every``, those
    whose step is a multiple of it."""
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    previous = (root / "LATEST").read_text().strip() if (root / "LATEST").is_file() else None
    atomic_write(root / "LATEST", name.encode())
    for old in root.glob("step_*"):
        kept = keep_every is not None and old.name[5:].isdigit() and int(old.name[5:]) % keep_every == 0
        if old.name not in (name, previous) and not kept:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(root: Union[str, Path]) -> Optional[Path]:
    """The checkpoint directory ``root/LATEST`` names, or None if there is none yet."""
    pointer = Path(root) / "LATEST"
    if not pointer.is_file():
        return None
    path = Path(root) / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file():
        raise RuntimeError(f"{pointer} names {path}, which is not a complete checkpoint")
    return path


def _check_same_run(model, config: CompressedConfig, tc: TrainConfig, task, start: int, ckpt: Path) -> None:
    """A resume continues the same run: refuse a changed architecture, recipe or task, naming the field."""
    def differences(old: dict, new: dict) -> tuple[str, str]:
        old, new = json.loads(json.dumps(old, default=list)), json.loads(json.dumps(new, default=list))
        keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        return (", ".join(f"{k}={old.get(k)!r}" for k in keys), ", ".join(f"{k}={new.get(k)!r}" for k in keys))

    was, now = differences(model.cfg.to_dict(), config.to_dict())
    if was:
        raise UserInputError(f"resume: the run in {ckpt.parent} has {was} but this call asks for {now}; a resume must "
                         "keep the architecture (start a new out_dir instead)")
    recorded = model.metadata.get("train_config")
    if isinstance(recorded, dict):
        was, now = differences(recorded, tc.to_dict())
        if was:
            raise UserInputError(f"resume: the run in {ckpt.parent} (at step {start}) was trained with {was} but this "
                             f"call asks for {now}; a resume must keep the recipe, including steps")
    stored_task = model.metadata.get("task")
    if isinstance(stored_task, dict) and hasattr(task, "to_dict"):
        was, now = differences(stored_task, task.to_dict())
        if was:
            raise UserInputError(f"resume: the run in {ckpt.parent} trained on a task with {was}; this call passes {now}")
    if start > tc.steps:
        raise UserInputError(f"resume: the run is at step {start}, beyond steps={tc.steps}")


def _load_checkpoint(ckpt: Path, tc: TrainConfig, device):
    state = json.loads((ckpt / STATE_FILE).read_text())
    model = CompressedTransformer.from_pretrained(ckpt).to(device)
    optimizer = _make_optimizer(model, tc)
    optimizer.load_state_dict(torch.load(ckpt / OPTIMIZER_FILE, map_location=device, weights_only=True))
    return model, optimizer, state["step"], state["log"], state["curves"]

