"""Next-token pretraining of `CompressedTransformer` (or its full twin) on natural text, on one process
or many (``torchrun``; FSDP2 ``fully_shard`` per block, ``torch.distributed.checkpoint``).

The batch of step ``s`` is a pure function of ``(seed, s)`` (row ``i``: the window `corpus.window_starts`
draws from ``(seed, s, i)``, or a natural-text needle prompt for the first ``needle_fraction`` of rows),
and the loss is the mean over every token of the global batch, so any process count or micro-batching
trains the same model to float tolerance and a resumed run equals an uninterrupted one.

A run folder holds ``pretrain.json`` (the recipe), ``data/`` (the tokenized corpus), ``checkpoints/step_N/``
(``LATEST`` names the newest complete one), ``curves.csv``, ``probe.csv`` and, at the end, ``config.json``
+ ``model.safetensors`` (``phaseinterp.load(out_dir)``, profiled on its stored `TextNeedle` task)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import pandas as pd
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from phaseinterp._checks import check_int, check_real
from phaseinterp._files import atomic_write, check_read_path, check_write_target, progress_bar
from phaseinterp.config import CompressedConfig
from phaseinterp.errors import UserInputError
from phaseinterp.models.transformer import CONFIG_FILE, WEIGHTS_FILE, CompressedTransformer
from phaseinterp.parallel.launch import Launch, all_gather, init_distributed, launch_info, raise_any, rank_device
from phaseinterp.phase import check_residue_modulus
from phaseinterp.tasks.text_needle import TextNeedle
from phaseinterp.train.checkpoints import STATE_FILE, changed_fields, latest_checkpoint, publish_checkpoint
from phaseinterp.train.compressed import TrainingDiverged, residue_rows
from phaseinterp.train.corpus import content_fingerprint, fingerprint, packed_rows, source_files, tokenize_corpus
from phaseinterp.train.recipe import Recipe, adamw
from phaseinterp.train.tokenizer import TextTokenizer

RUN_FILE = "pretrain.json"
CURVES_FILE = "curves.csv"
PROBE_FILE = "probe.csv"
KIND = "pretraining run"
# Execution settings: they change speed or memory, not the numbers a step computes (beyond float
# summation order), so a resume may change them.
EXECUTION_FIELDS = ("micro_batch", "activation_checkpointing", "compile", "max_minutes", "progress_every",
                    "keep_every", "force_fsdp")


@dataclass(frozen=True)
class PretrainConfig(Recipe):
    """The recipe of a pretraining run (everything but the architecture, the data and the tokenizer).

    ``global_batch`` sequences of ``seq_len`` tokens per optimizer step over all processes; ``micro_batch``
    per forward on each process (default: its whole share), the rest by gradient accumulation. `adamw`
    (no decay on the embedding and the gate parameters) on the schedule `Recipe.lr_at`, clipping at
    ``grad_clip``. ``needle_fraction`` of each batch's rows are needle prompts (`TextNeedle.training_rows`).
    ``bf16``: bfloat16 mixed precision on CUDA (autocast; on several processes FSDP2's
    ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``); on CPU only with ``cpu_bf16`` too
    (`compute_dtype` resolves the pair). ``force_fsdp``: FSDP2 on one process too. ``max_minutes``: end
    early (checkpointed, resumable). Checkpoints every ``checkpoint_every`` steps; the newest two are kept,
    plus every multiple of ``keep_every``."""

    seq_len: int = 512
    global_batch: int = 16
    micro_batch: Optional[int] = None
    steps: int = 1000
    seed: int = 0
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    needle_fraction: float = 0.0
    heldout_fraction: float = 0.02
    probe_every: int = 100
    probe_per_residue: int = 8
    probe_seed: int = 12345
    checkpoint_every: int = 100
    activation_checkpointing: bool = False
    compile: bool = False
    bf16: bool = True
    max_minutes: Optional[float] = None
    progress_every: int = 10
    keep_every: Optional[int] = None
    cpu_bf16: bool = False
    force_fsdp: bool = False

    def __post_init__(self) -> None:
        self._check_optimizer()
        for name in ("seq_len", "global_batch", "probe_every", "probe_per_residue", "checkpoint_every",
                     "progress_every", "micro_batch", "keep_every"):
            if getattr(self, name) is not None or name not in ("micro_batch", "keep_every"):  # those two: None too
                self._store(name, check_int(name, getattr(self, name), 1))
        for name, lo, hi in (("needle_fraction", 0.0, 1.0), ("heldout_fraction", 1e-6, 0.5)):
            self._store(name, check_real(name, getattr(self, name), lo, hi, high_open=False))
        if self.max_minutes is not None:
            self._store("max_minutes", check_real("max_minutes", self.max_minutes, 0.0, low_open=True,
                                                  why=" (or None: run every step)"))
        for name in ("bf16", "cpu_bf16", "activation_checkpointing", "compile", "force_fsdp"):
            if not isinstance(getattr(self, name), bool):
                raise UserInputError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.cpu_bf16 and not self.bf16:
            raise UserInputError("cpu_bf16=True asks for bfloat16 on CPU too, but bf16=False turns mixed precision "
                                 "off (set bf16=True, or cpu_bf16=False for fp32)")

    def compute_dtype(self, device_type: str) -> Optional[torch.dtype]:
        """``torch.bfloat16`` when a step on a ``device_type`` device ("cuda", "cpu") runs in bf16 mixed
        precision, else None (fp32): bf16 on CUDA, and on other devices only with ``cpu_bf16``."""
        if self.bf16 and (device_type == "cuda" or self.cpu_bf16):
            return torch.bfloat16
        return None

    def rows_per_forward(self, nproc: int) -> tuple[int, int]:
        """Each of ``nproc`` processes' rows per step and per forward (``micro_batch``, default all of
        them), or a one-line refusal when they do not divide."""
        if self.global_batch % nproc:
            raise UserInputError(f"global_batch={self.global_batch} is not divisible by nproc={nproc}")
        share = self.global_batch // nproc
        micro = self.micro_batch or share
        if share % micro:
            raise UserInputError(f"micro_batch={micro} does not divide each process's {share} rows (global_batch="
                                 f"{self.global_batch} over {nproc} processes)")
        return share, micro

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


# Per-preset recipes: the fields a preset's run takes when the user gives no value (`preset_recipe`; a
# --config file or a flag wins). `PretrainConfig`'s own defaults are CPU-scale (`tiny`, `cpu-small`); the
# GPU presets take GPT-3's and Pythia's settings for their size and 500M tokens (64 x 2,048 x 3,815 steps).
PRESET_RECIPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(seq_len=2048, global_batch=64, steps=3815, lr=3e-4, warmup_steps=380, min_lr_ratio=0.1,
                       weight_decay=0.1, betas=(0.9, 0.95)),
    "qwen3-100m": dict(seq_len=2048, global_batch=64, steps=3815, lr=6e-4, warmup_steps=380, min_lr_ratio=0.1,
                       weight_decay=0.1, betas=(0.9, 0.95)),
}


def preset_recipe(name: str) -> dict[str, Any]:
    """The `PretrainConfig` fields preset ``name`` takes by default (`PRESET_RECIPES`; none for the CPU
    presets, which take `PretrainConfig`'s own defaults)."""
    return dict(PRESET_RECIPES.get(name, {}))


@dataclass(frozen=True)
class PretrainResult:
    """A finished (or stopped) run: the model (full weights, on rank 0; None elsewhere), its curves."""

    model: Optional[CompressedTransformer]
    out_dir: Optional[Path]
    curves: pd.DataFrame
    probe: pd.DataFrame


# ------------------------------------------------------------------ checks
def check_model_for_text(config: CompressedConfig, tokenizer: TextTokenizer, seq_len: int) -> None:
    """The architecture can be pretrained on this tokenizer at this length, or a one-line refusal."""
    if config.d_vocab < tokenizer.vocab_size:
        raise UserInputError(f"d_vocab={config.d_vocab} is smaller than the tokenizer's vocabulary "
                             f"({tokenizer.vocab_size} tokens in {tokenizer.folder})")
    if config.is_compressed and seq_len % config.stride:
        raise UserInputError(f"seq_len={seq_len} is not a multiple of the stride S={config.stride} (valid: "
                             f"{config.stride}, {2 * config.stride}, ...; nearest {max(1, round(seq_len / config.stride)) * config.stride})")
    if config.n_ctx < seq_len:
        raise UserInputError(f"seq_len={seq_len} is longer than the model's n_ctx={config.n_ctx}")


def check_nproc(nproc: Any) -> int:
    """``nproc`` processes fit this machine: at most one per CUDA device, or per CPU core without CUDA."""
    check_int("nproc", nproc, 1)
    if torch.cuda.is_available():
        limit, what = torch.cuda.device_count(), "CUDA devices"
    else:
        limit, what = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(), "CPU cores"
    if nproc > limit:
        raise UserInputError(f"nproc={nproc} is more than this machine's {limit} {what} (valid: 1..{limit})")
    return nproc


def check_resume(out: Path, record: dict) -> None:
    """A resume continues the same run: architecture, recipe (execution settings aside), data and tokenizer."""
    was = json.loads((out / RUN_FILE).read_text())
    # a recipe field added after the run was recorded took its default there (what the run computed)
    defaults = PretrainConfig().to_dict()
    was["train"] = {**{k: v for k, v in defaults.items() if k not in was.get("train", {})}, **was.get("train", {})}
    # the data: its content when the record has it (the corpus may have moved or been copied); a run recorded
    # before the content key compares the source's path and fingerprint (paths, sizes, mtimes) as it did
    data_ignore = ("source", "fingerprint") if "content_sha256" in was.get("data", {}) else ("content_sha256",)
    for part, ignore in (("model", ("seed",)), ("train", EXECUTION_FIELDS), ("data", data_ignore),
                         ("tokenizer", ("folder",))):
        shown = changed_fields(was.get(part, {}), record[part], ignore)
        if shown:
            raise UserInputError(f"--resume: the run in {out} has another {part} ({shown}); a resume keeps the "
                                 "run's settings (start a new --out instead)")


# ------------------------------------------------------------------ the run
def probe_settings(config: CompressedConfig, seq_len: int) -> dict:
    """The needle probe's geometry for ``seq_len``-token prompts: residues mod 24 (mod 2 S when the
    prompts are shorter than 256 tokens or S does not divide 24), a target band of a third of the prompt
    (at most 120 positions) and up to 8 records."""
    stride = config.stride
    residues = 24 if (24 % stride == 0 and seq_len >= 256) else 2 * stride
    return dict(seq_len=seq_len, residue_modulus=residues, n_records=max(4, min(8, seq_len // 32)),
                target_window=min(120, max(3 * residues, seq_len // 3)))


def _probe_task(tokenizer: TextTokenizer, heldout: Optional[np.ndarray], config: CompressedConfig,
                tc: PretrainConfig) -> TextNeedle:
    """The held-out needle probe; with ``heldout=None`` a stand-in filler checks the geometry before
    the corpus is read."""
    settings = probe_settings(config, tc.seq_len)
    if heldout is None:
        keys, values = TextNeedle.pieces(tokenizer)
        task = TextNeedle(key_ids=keys, value_ids=values, separator_ids=(0,), filler_text=(0,) * (tc.seq_len + 1),
                          **settings)
    else:
        task = TextNeedle.from_tokenizer(tokenizer, heldout, **settings)
    check_residue_modulus(task.residue_modulus, config.stride)
    return task


def prepare(config: CompressedConfig, data: Union[str, Path], tokenizer: Union[str, Path], tc: PretrainConfig,
            out_dir: Union[str, Path], *, resume: bool = False, progress: bool = True,
            paper_run: Optional[str] = None) -> dict:
    """Everything checked and prepared before a process group starts: the tokenizer, the model against
    it, the output folder (writable; a previous run only with ``resume``, and then the same settings),
    the tokenized corpus (``out_dir/data``) and the needle probe. Returns the run record. ``paper_run``:
    the published run this one reproduces (`phaseinterp.paper.config`), recorded as ``paper_run`` so the
    evaluation knows which published profile to compare with (`phaseinterp.paper.compare`)."""
    tok = TextTokenizer(tokenizer)
    check_model_for_text(config, tok, tc.seq_len)
    _probe_task(tok, None, config, tc)  # a vocabulary or length that cannot hold the probe, before any reading
    out = check_write_target(out_dir, KIND, overwrite=resume, name="out", flag="--resume (resume=True) to continue it",
                             staged=False)
    source_files(data)  # a path with no text is refused before anything is written
    record = {"model": config.to_dict(), "train": tc.to_dict(),
              "data": {"source": str(Path(data).resolve()), "fingerprint": fingerprint(data),
                       "content_sha256": content_fingerprint(data)},
              "tokenizer": {"folder": str(Path(tokenizer).resolve()), "sha256": tok.sha256}}
    if paper_run is not None:
        record["paper_run"] = paper_run
    resuming = resume and (out / RUN_FILE).is_file()
    if resuming:
        check_resume(out, record)
    corpus = tokenize_corpus(data, tok, out / "data", heldout_fraction=tc.heldout_fraction, progress=progress)
    if corpus.manifest["train_tokens"] <= tc.seq_len:
        raise UserInputError(f"data={str(data)!r} has {corpus.manifest['train_tokens']} training tokens; a "
                             f"seq_len={tc.seq_len} window needs more")
    _probe_task(tok, corpus.tokens("heldout"), config, tc)  # enough held-out text for the probe
    if not resuming:
        atomic_write(out / RUN_FILE, json.dumps(record, indent=2, sort_keys=True).encode())
    return record


def _batch(rows: range, step: int, tc: PretrainConfig, train_tokens: np.ndarray,
           needle: TextNeedle) -> torch.Tensor:
    """The rows ``rows`` of step ``step``'s global batch, ``[len(rows), seq_len + 1]``."""
    n_needle = int(round(tc.needle_fraction * tc.global_batch))
    parts = []
    for i in rows:
        if i < n_needle:
            row_seed = int(np.random.SeedSequence([tc.seed, step, i]).generate_state(1)[0])
            parts.append(needle.training_rows(1, row_seed, train_tokens))
        else:
            parts.append(packed_rows(train_tokens, tc.seq_len, tc.seed, step, range(i, i + 1)))
    return torch.cat(parts)


def _wrap(model: CompressedTransformer, tc: PretrainConfig, launch: Launch, device: torch.device):
    model.activation_checkpointing = tc.activation_checkpointing
    if tc.compile:
        for block in model.blocks:
            block.compile()
    if launch.world_size > 1 or tc.force_fsdp:
        dtype = tc.compute_dtype(device.type)
        policy = (MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype is not None
                  else MixedPrecisionPolicy())
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    return model


_optimizer = adamw  # the name benchmarks/pretrain_speed.py imports


@contextlib.contextmanager
def _process_group_for(tc: PretrainConfig, launch: Launch):
    """With ``force_fsdp`` on one process: a world-size-1 process group (NCCL on CUDA, gloo otherwise) for
    the run, so FSDP2 and DCP take their sharded path; destroyed at the end. Otherwise nothing."""
    if not (tc.force_fsdp and launch.world_size == 1 and not torch.distributed.is_initialized()):
        yield
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank_device(launch))
    torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def _barrier(launch: Launch) -> None:
    if launch.world_size > 1:
        torch.distributed.barrier()


@contextlib.contextmanager
def _single_process_quiet(launch: Launch):
    """DCP warns that it "assumes the intent" of a single process when no group runs: here it is meant."""
    with warnings.catch_warnings():
        if launch.world_size == 1:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _save(root: Path, model, optimizer, step: int, rows: list, probe_rows: list, launch: Launch,
          keep_every: Optional[int] = None) -> None:
    """A distributed checkpoint (DCP) written into a temporary folder, then `publish_checkpoint`."""
    name = f"step_{step:06d}"
    tmp = root / f".{name}.tmp"
    if launch.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(launch)
    model_state, optim_state = get_state_dict(model, optimizer)
    with _single_process_quiet(launch):
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp))
    _barrier(launch)
    if launch.is_main:
        atomic_write(tmp / STATE_FILE, json.dumps({"step": step, "curves": rows, "probe": probe_rows,
                                                   "world_size": launch.world_size}).encode())
        publish_checkpoint(root, tmp, name, keep_every=keep_every)
    _barrier(launch)


def _load(ckpt: Path, model, optimizer) -> tuple[int, list, list]:
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    with _single_process_quiet(launch_info()):
        dcp.load(state, checkpoint_id=str(ckpt))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    saved = json.loads((ckpt / STATE_FILE).read_text())
    return saved["step"], saved["curves"], saved["probe"]


def _full_model(model, config: CompressedConfig, launch: Launch) -> Optional[CompressedTransformer]:
    """The full weights gathered on rank 0, as a CPU `CompressedTransformer` (None on other ranks)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not launch.is_main:
        return None
    full = CompressedTransformer(config)
    full.load_state_dict({k: v.detach().float().cpu() for k, v in state.items()})
    return full.eval()


def _probe(model, batch, stride: int, step: int, tokens_seen: int, launch: Launch, device,
           autocast=None) -> list[dict]:
    """Top-1 accuracy of the probe's answers per residue; the prompts are split over the processes. The
    forwards run under the training's ``autocast``: with FSDP2's bf16 parameters and no autocast, q, k and
    v would meet attention in different dtypes."""
    was = model.training
    model.eval()
    n = batch.tokens.shape[0]
    per = -(-n // launch.world_size)
    mine = range(launch.rank * per, min(n, (launch.rank + 1) * per))
    correct = []
    with torch.no_grad(), autocast if autocast is not None else contextlib.nullcontext():
        for i in range(mine.start, mine.stop, 8):
            j = min(i + 8, mine.stop)
            logits = model(batch.tokens[i:j].to(device))[:, -1]  # the full forward: FSDP's hooks run on the root
            correct.extend((logits.argmax(-1).cpu() == batch.answer[i:j]).tolist())
        if launch.world_size > 1 and not mine:  # a rank without prompts still takes part in FSDP's collectives
            model(batch.tokens[:1].to(device))
    model.train(was)
    gathered = [c for part in all_gather(correct, launch) for c in part]
    return residue_rows(batch.meta["residue"].to_numpy(), np.asarray(gathered, dtype=float), stride, step=step,
                        tokens=tokens_seen)


def _probe_summary(rows: list[dict]) -> dict:
    frame = pd.DataFrame(rows)
    by_phase = frame.groupby("phase").apply(lambda g: np.average(g.accuracy, weights=g.n), include_groups=False)
    return {"probe_mean": float(np.average(frame.accuracy, weights=frame.n)), "probe_worst": float(by_phase.min()),
            "probe_best": float(by_phase.max()), "probe_gap": float(by_phase.max() - by_phase.min())}


def autocast_for(device: torch.device, bf16: bool = True, cpu_bf16: bool = False):
    """bfloat16 autocast on CUDA (when ``bf16``), on CPU only with ``cpu_bf16`` too, none otherwise
    (`PretrainConfig.compute_dtype`)."""
    dtype = PretrainConfig(bf16=bf16, cpu_bf16=cpu_bf16).compute_dtype(device.type)
    if dtype is not None:
        return torch.autocast(device.type, dtype=dtype)
    return torch.autocast(device.type, enabled=False)


def train_step(model, optimizer: torch.optim.Optimizer, rows: torch.Tensor, *, micro: int, grad_clip: float,
               autocast) -> torch.Tensor:
    """One optimizer step on this process's ``rows`` (``[n, seq_len + 1]`` token ids), ``micro`` rows per
    forward: the gradient of the mean next-token loss over all ``n * seq_len`` targets (each micro-batch's
    summed loss scaled by the process's token count; FSDP's reduction then averages the processes),
    clipped at ``grad_clip``. Returns the summed loss of the rows (detached)."""
    device = next(model.parameters()).device
    n, width = rows.shape
    total = torch.zeros((), device=device)
    for i in range(0, n, micro):
        chunk = rows[i : i + micro].to(device)
        with autocast:
            logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
        (loss / (n * (width - 1))).backward()
        total += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def pretrain(config: CompressedConfig, data: Union[str, Path], tokenizer: Union[str, Path],
             train_config: Optional[PretrainConfig] = None, *, out_dir: Union[str, Path], resume: bool = False,
             progress: bool = True, stop_after: Optional[int] = None, **overrides: Any) -> PretrainResult:
    """Pretrain ``config`` on ``data`` with ``tokenizer`` (module docstring); ``overrides`` replace fields
    of ``train_config``. One process as is, several under ``torchrun`` (``phaseinterp pretrain --nproc
    K``). ``stop_after`` ends after that many steps (checkpointed).

    Refused before any step, one line each: a data path with no text, a tokenizer folder without
    tokenizer.json, a vocabulary larger than ``d_vocab`` or too small for the needle probe, a
    ``seq_len`` not a multiple of the stride or above ``n_ctx``, a ``global_batch`` not divisible by
    the process count (times ``micro_batch``), and a resume whose settings differ (naming the field)."""
    tc = dataclasses.replace(train_config or PretrainConfig(), **overrides)
    launch = init_distributed()
    share, micro = tc.rows_per_forward(launch.world_size)
    out = Path(out_dir)
    error = None
    if launch.is_main:
        try:
            prepare(config, data, tokenizer, tc, out, resume=resume, progress=progress)
        except UserInputError as err:
            error = str(err)
    raise_any(error, launch)
    tok = TextTokenizer(tokenizer)
    corpus = tokenize_corpus(data, tok, out / "data", heldout_fraction=tc.heldout_fraction, progress=False)
    train_tokens = corpus.tokens("train")
    needle = _probe_task(tok, corpus.tokens("heldout"), config, tc)
    probe_batch = needle.generate(tc.probe_per_residue, seed=tc.probe_seed, strict=False)

    with _process_group_for(tc, launch):
        device = rank_device(launch)
        model = CompressedTransformer(config).to(device)
        model.train()
        model = _wrap(model, tc, launch, device)
        optimizer = adamw(model, tc)
        ckpt_root = out / "checkpoints"
        start, rows, probe_rows = 0, [], []
        latest = latest_checkpoint(ckpt_root) if resume else None
        if latest is not None:
            start, rows, probe_rows = _load(latest, model, optimizer)
        if start > tc.steps:
            raise UserInputError(f"--resume: the run is at step {start}, beyond steps={tc.steps}")
        end = tc.steps if stop_after is None else min(tc.steps, start + stop_after)
        autocast = autocast_for(device, tc.bf16, tc.cpu_bf16)
        my_rows = range(launch.rank * share, (launch.rank + 1) * share)
        tokens_per_step = tc.global_batch * tc.seq_len
        bar = progress_bar(progress and launch.is_main, tc.steps, "pretrain", initial=start, leave=True)
        t_start = time.time()
        try:
            for step in range(start, end):
                t0 = time.time()
                for group in optimizer.param_groups:
                    group["lr"] = tc.lr_at(step)
                batch = _batch(my_rows, step, tc, train_tokens, needle)
                loss_sum = train_step(model, optimizer, batch, micro=micro, grad_clip=tc.grad_clip, autocast=autocast)
                if launch.world_size > 1:
                    torch.distributed.all_reduce(loss_sum)
                mean_loss = loss_sum.item() / tokens_per_step
                if not math.isfinite(mean_loss):
                    raise TrainingDiverged(f"loss became {mean_loss} at step {step}; the last good checkpoint is in {ckpt_root}")
                done = step + 1
                seconds = time.time() - t0
                row = dict(step=done, tokens=done * tokens_per_step, loss=mean_loss, lr=tc.lr_at(step),
                           tokens_per_s=tokens_per_step / seconds, seconds=time.time() - t_start)
                if done % tc.probe_every == 0 or done == tc.steps:
                    new = _probe(model, probe_batch, config.stride, done, done * tokens_per_step, launch, device,
                                 autocast)
                    probe_rows.extend(new)
                    row.update(_probe_summary(new))
                rows.append(row)
                if bar is not None:
                    bar.update(1)
                    if done % tc.progress_every == 0:
                        recent = rows[-tc.progress_every:]
                        bar.set_postfix(loss=f"{np.mean([r['loss'] for r in recent]):.3f}",
                                        tok_s=f"{np.mean([r['tokens_per_s'] for r in recent]):.0f}")
                out_of_time = tc.max_minutes is not None and (time.time() - t_start) / 60 >= tc.max_minutes
                if launch.world_size > 1:  # every rank stops at the same step
                    flag = torch.tensor(float(out_of_time), device=device)
                    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
                    out_of_time = bool(flag.item())
                if done % tc.checkpoint_every == 0 or done == end or out_of_time:
                    _save(ckpt_root, model, optimizer, done, rows, probe_rows, launch, tc.keep_every)
                    if launch.is_main:
                        _write_tables(out, rows, probe_rows)
                if out_of_time:
                    break
        finally:
            if bar is not None:
                bar.close()
        full = _full_model(model, config, launch)
        if launch.is_main:
            _write_tables(out, rows, probe_rows)
            full.metadata.update({"task": needle.to_dict(), "task_type": "TextNeedle", "pretrain": tc.to_dict(),
                                  "step": rows[-1]["step"] if rows else start, "tokens": rows[-1]["tokens"] if rows else 0,
                                  "tokenizer": str(Path(tokenizer).resolve())})
            _write_model(out, full)
        _barrier(launch)
        return PretrainResult(full, out, pd.DataFrame(rows), pd.DataFrame(probe_rows))


def _write_tables(out: Path, rows: list, probe_rows: list) -> None:
    atomic_write(out / CURVES_FILE, pd.DataFrame(rows).to_csv(index=False).encode())
    atomic_write(out / PROBE_FILE, pd.DataFrame(probe_rows).to_csv(index=False).encode())


def _write_model(out: Path, model: CompressedTransformer) -> None:
    """``config.json`` + ``model.safetensors`` into the run folder (weights first: each file is renamed into
    place, and a crash between the two leaves a checksum mismatch that loading reports)."""
    blob, config = model.checkpoint_files()
    atomic_write(out / WEIGHTS_FILE, blob)
    atomic_write(out / CONFIG_FILE, config)


def snapshot_steps(run_dir: Union[str, Path]) -> list[int]:
    """The steps of the complete checkpoints kept in a pretraining run folder (``checkpoints/step_N``), ascending."""
    root = Path(run_dir) / "checkpoints"
    steps = [int(p.name[5:]) for p in root.glob("step_*") if p.name[5:].isdigit() and (p / STATE_FILE).is_file()]
    return sorted(steps)


def load_snapshot(run_dir: Union[str, Path], step: Optional[int] = None) -> CompressedTransformer:
    """The model of the pretraining run folder ``run_dir`` at its kept checkpoint ``checkpoints/step_N``
    (default: the newest, the one ``LATEST`` names), built from ``pretrain.json``'s model config, on the
    CPU in fp32 and eval mode. ``model.metadata`` records ``step``, ``tokens`` (seen by then), the
    ``pretrain`` recipe and the ``tokenizer`` folder. Reads only: the run may be training meanwhile."""
    step = None if step is None else check_int("step", step, 0, why=" (a kept checkpoint's step)")
    out = check_read_path(run_dir, f"a pretraining run folder ({RUN_FILE}, checkpoints/)", name="run_dir")
    if not (out / RUN_FILE).is_file():
        raise UserInputError(f"run_dir={str(run_dir)!r} is not a pretraining run folder (it has no {RUN_FILE})")
    record = json.loads((out / RUN_FILE).read_text())
    kept = snapshot_steps(out)
    if step is None:
        ckpt = latest_checkpoint(out / "checkpoints")
        if ckpt is None:
            raise UserInputError(f"run_dir={str(run_dir)!r} has no checkpoint yet")
    else:
        if step not in kept:
            raise UserInputError(f"step={step} is not a kept checkpoint of {str(run_dir)!r} (kept: {kept or 'none'})")
        ckpt = out / "checkpoints" / f"step_{step:06d}"
    model = CompressedTransformer(CompressedConfig.from_dict(record["model"]))
    state = {"model": get_model_state_dict(model)}
    with _single_process_quiet(launch_info()):
        dcp.load(state, checkpoint_id=str(ckpt))
    model.load_state_dict(state["model"])
    done = json.loads((ckpt / STATE_FILE).read_text())["step"]
    train = record.get("train", {})
    model.metadata.update({"step": done, "tokens": done * train.get("global_batch", 0) * train.get("seq_len", 0),
                           "pretrain": train, "tokenizer": record.get("tokenizer", {}).get("folder")})
    return model.eval()
