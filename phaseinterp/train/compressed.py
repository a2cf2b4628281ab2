"""Controlled pretraining on CPU: ``train(config, task, steps=...)`` trains a `CompressedTransformer` from
scratch (AdamW, warm-up + cosine decay, clipping), every batch seeded by ``(seed, step)`` so a resumed run
reproduces the uninterrupted one; curricula (`CurriculumStage`) and task mixtures (periodic rows)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
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

from phaseinterp._checks import check_device, check_indices, check_int, check_seed, check_real, listed
from phaseinterp._files import atomic_write, check_read_path, check_write_target, normal_mode, progress_bar
from phaseinterp.config import CompressedConfig
from phaseinterp.errors import UserInputError
from phaseinterp.models.transformer import CompressedTransformer
from phaseinterp.phase import check_residue_modulus
from phaseinterp.results import plotting
from phaseinterp.train.checkpoints import STATE_FILE, changed_fields, latest_checkpoint, publish_checkpoint
from phaseinterp.train.recipe import Recipe, adamw

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
        object.__setattr__(self, "until", check_real("CurriculumStage.until", self.until, 0.0, 1.0, low_open=True,
                                                     high_open=False))


@dataclass(frozen=True)
class TrainConfig(Recipe):
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
        self._check_optimizer()
        for name in ("batch_size", "eval_every", "checkpoint_every", "probe_per_residue"):
            self._store(name, check_int(name, getattr(self, name), 1))
        self._store("probe_seed", check_seed("probe_seed", self.probe_seed))
        if self.loss_on not in ("answer", "values"):
            raise UserInputError(f"loss_on={self.loss_on!r} is not one of ('answer', 'values')")
        self._store("periodic_fraction", check_real("periodic_fraction", self.periodic_fraction, 0.0, 1.0))
        self._check_periodic_block()
        steps = listed(self.snapshot_steps)
        self._store("snapshot_steps", tuple(check_indices("snapshot_steps", steps, 1, unit="step")) if steps else ())
        stages = [CurriculumStage(**s) if isinstance(s, dict) else s for s in self.curriculum]
        object.__setattr__(self, "curriculum", tuple(stages))
        if any(b.until <= a.until for a, b in zip(stages, stages[1:])):
            raise UserInputError("curriculum stages must have strictly increasing `until`")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def stage_at(self, step: int) -> dict[str, Any]:
        """Task knobs at ``step`` (the first stage whose ``until`` lies beyond it; {} after)."""
        frac = step / self.steps
        for stage in self.curriculum:
            if frac < stage.until:
                return dict(stage.task)
        return {}


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


def training_batch(task, recipe, step: int, stage: dict[str, Any], loss_on: str = "answer"):
    """The batch of ``step``, a pure function of ``(recipe.seed, step)`` (which makes a resume exact):
    ``recipe.batch_size`` rows, the last ``periodic_fraction`` of them `periodic_rows`, the others the task's
    training rows with the task knobs ``stage``. Returns ``(tokens, targets, loss mask, number of task rows)``."""
    step_seed = recipe.seed * 1_000_003 + step
    gen = torch.Generator().manual_seed(step_seed)
    n_periodic = int(round(recipe.periodic_fraction * recipe.batch_size))
    n_task = recipe.batch_size - n_periodic
    rows = task.sample_train(n_task, step_seed, **stage)
    mask = rows.value_mask if loss_on == "values" else rows.answer_mask
    tokens, targets = rows.tokens, rows.targets
    if n_periodic:
        p_tok, p_tgt, p_mask = periodic_rows(n_periodic, task.seq_len, task.vocab.size, recipe.periodic_block, gen,
                                             low=len(task.vocab.specials))
        tokens, targets, mask = torch.cat([tokens, p_tok]), torch.cat([targets, p_tgt]), torch.cat([mask, p_mask])
    return tokens, targets, mask, n_task


def residue_rows(residues, correct, stride: int, **columns) -> list[dict]:
    """One row per residue of a probe: ``columns`` (the step, ...), residue, phase (residue mod ``stride``),
    accuracy (the mean of ``correct`` over its prompts) and n (their count)."""
    frame = pd.DataFrame({"residue": residues, "correct": correct})
    return [dict(**columns, residue=int(r), phase=int(r) % stride, accuracy=float(g.correct.mean()), n=int(len(g)))
            for r, g in frame.groupby("residue")]


def _probe_curves(model, probe, device, stride: int, step: int) -> list[dict]:
    """Accuracy per residue on the fixed held-out probe set."""
    model.eval()
    correct = []
    with torch.inference_mode():
        for i in range(0, probe.tokens.shape[0], 256):
            logits = model(probe.tokens[i : i + 256].to(device))
            pred = logits[torch.arange(logits.shape[0]), probe.answer_pos[i : i + 256].to(device)].argmax(-1)
            correct.append((pred.cpu() == probe.answer[i : i + 256]))
    return residue_rows(probe.meta["residue"].to_numpy(), torch.cat(correct).float().numpy(), stride, step=step)


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
                                 flag="resume=True (CLI: --resume) to continue it", staged=False)
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
    updating = False  # True while parameters may be half-updated
    try:
        for step in range(start, end):
            model.train()
            tokens, targets, mask, n_task = training_batch(task, tc, step, tc.stage_at(step), tc.loss_on)
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
    shown = changed_fields(source.cfg.to_dict(), model.cfg.to_dict(), ignore=("seed",))
    if shown:
        raise UserInputError(f"init_from={str(folder)!r} has another architecture than the config asks for ({shown})")
    with torch.no_grad():
        model.load_state_dict(source.state_dict())


def _make_optimizer(model, tc: TrainConfig) -> torch.optim.Optimizer:
    return adamw(model, tc, decay_gates=True)  # unlike pretrain's: the zoo was trained so


def _save_checkpoint(root: Path, model, optimizer, step: int, log_rows, curve_rows) -> None:
    """Write ``root/step_<step>/`` (model, optimizer, state) into a temporary directory, then
    `publish_checkpoint` it. The previous checkpoint is kept."""
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


def _check_same_run(model, config: CompressedConfig, tc: TrainConfig, task, start: int, ckpt: Path) -> None:
    """A resume continues the same run: refuse a changed architecture, recipe or task, naming the field."""
    asked = {"architecture": config.to_dict(), "recipe": tc.to_dict(),
             "task": task.to_dict() if hasattr(task, "to_dict") else None}
    recorded = {"architecture": model.cfg.to_dict(), "recipe": model.metadata.get("train_config"),
                "task": model.metadata.get("task")}
    for part, was in recorded.items():
        if isinstance(was, dict) and isinstance(asked[part], dict) and (shown := changed_fields(was, asked[part])):
            raise UserInputError(f"resume: the run in {ckpt.parent} (at step {start}) has another {part} ({shown}); a "
                                 "resume keeps the architecture, the recipe (steps included) and the task (start a new "
                                 "out_dir instead)")
    if start > tc.steps:
        raise UserInputError(f"resume: the run is at step {start}, beyond steps={tc.steps}")


def _load_checkpoint(ckpt: Path, tc: TrainConfig, device):
    state = json.loads((ckpt / STATE_FILE).read_text())
    model = CompressedTransformer.from_pretrained(ckpt).to(device)
    optimizer = _make_optimizer(model, tc)
    optimizer.load_state_dict(torch.load(ckpt / OPTIMIZER_FILE, map_location=device, weights_only=True))
    return model, optimizer, state["step"], state["log"], state["curves"]
