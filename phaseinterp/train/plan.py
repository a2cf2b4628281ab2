"""Will a pretraining run fit its devices? Per-device memory of `phaseinterp.train.pretrain` before any
data, tokenizer or GPU (`plan_memory`; ``phaseinterp pretrain --plan``).

Bytes per device for ``N`` parameters over ``P`` processes (FSDP2 shards; one process keeps all):

- **parameters** ``4 N / P``, **gradients** ``4 N / P``, **optimizer** ``8 N / P`` (AdamW);
- **working copies**: with bf16 on several processes FSDP2's all-gathered bf16 parameters of the root
  and two blocks plus two blocks' unsharded fp32 gradients; on one process autocast's copy (``2 N``);
- **activations** per row times the micro-batch: measured on one block of the run's architecture
  (saved tensors of the block's CPU forward on fake tensors, shapes only, at two lengths up to 512,
  extrapolated as ``a T + c T^2``),
  times the layers; with activation checkpointing a block keeps only its input plus one block's;
- **logits** per row: ``T V`` for the log-probs and their gradient (fp32) and the logits.

A run fits when the sum is at most ``usable`` of the device's memory; `MemoryPlan.advice` names the
micro-batch and/or activation checkpointing that would fit."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import weakref
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensorMode  # torch's shape-only tensors (torch.compile's)

from phaseinterp._checks import check_int, check_real
from phaseinterp.config import CompressedConfig
from phaseinterp.models.transformer import CompressedTransformer, parameter_count

GIB = 2**30
USABLE = 0.9
DEFAULT_GPU_GIB = 80.0  # planning for a GPU from a machine without CUDA: an 80 GB H100 / A100
MEASURE_LEN = 512  # the longest sequence a block is measured at (longer runs extrapolate)


def block_activation_bytes(config: CompressedConfig, seq_len: int, *, dtype: Optional[torch.dtype] = None,
                           rows: int = 1) -> int:
    """Bytes one block saves for the backward over ``rows`` rows of ``seq_len`` tokens: the block's forward
    in a 1-layer model with the architecture's widths, run on torch's fake CPU tensors (the CPU forward's
    dispatch, CPU autocast included when ``dtype`` is bfloat16, as the GPU's autocast computes; shapes and
    dtypes only, no arithmetic), each saved tensor's storage counted once, the parameters left out (their
    bf16 copies under autocast are counted: they do not grow with the rows)."""
    offsets = config.window_offsets
    if isinstance(offsets, tuple) and offsets and isinstance(offsets[0], tuple):  # per layer: the first
        offsets = offsets[:1]
    small = config.replace(n_layers=1, d_vocab=min(config.d_vocab, 512), n_ctx=max(config.n_ctx, seq_len),
                           window_offsets=offsets)
    fake = FakeTensorMode()
    with fake:
        model = CompressedTransformer(small).train()
    params = {p.untyped_storage()._cdata for p in model.parameters()}  # _cdata: the storage itself
    saved: list[weakref.ref] = []

    def pack(t):
        saved.append(weakref.ref(t))
        return t

    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == torch.bfloat16
                else contextlib.nullcontext())
    with fake:
        resid = model.W_E[torch.zeros(rows, seq_len, dtype=torch.long)]  # the embedding: outside the hooks
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            out = model.blocks[0](resid, None, 0, None, False)  # kept: its graph holds what the backward reads
        storages = {}  # what the graph still holds (a branch dropped, as the layer cache is, frees its own)
        for storage in (t.untyped_storage() for ref in saved if (t := ref()) is not None):
            if storage._cdata not in params:
                storages.setdefault(storage._cdata, storage.nbytes())
    del out
    return sum(storages.values())


def block_bytes_per_row(config: CompressedConfig, seq_len: int, *, dtype: Optional[torch.dtype] = None) -> float:
    """One block's saved activations per row of ``seq_len`` tokens: measured (`block_activation_bytes`)
    with 2 rows minus 1 row (what grows with the rows), at two lengths up to `MEASURE_LEN`, then
    ``a T + c T^2`` through both (c >= 0: the compressed attention's per-block masks grow with the
    entries a query sees)."""
    unit = math.lcm(config.stride if config.is_compressed else 1, 8)
    t1 = max(2 * unit, min(seq_len, MEASURE_LEN) // unit * unit)
    t0 = max(unit, t1 // 2 // unit * unit)

    def per_row(t: int) -> int:
        return (block_activation_bytes(config, t, dtype=dtype, rows=2)
                - block_activation_bytes(config, t, dtype=dtype, rows=1))

    b1, b0 = per_row(t1), per_row(t0)
    c = max(0.0, (b1 / t1 - b0 / t0) / (t1 - t0)) if t1 > t0 else 0.0
    a = b1 / t1 - c * t1
    return a * seq_len + c * seq_len**2


def activation_bytes_per_row(config: CompressedConfig, seq_len: int, *, dtype: Optional[torch.dtype] = None,
                             activation_checkpointing: bool = False,
                             per_block: Optional[float] = None) -> dict[str, int]:
    """Saved activations of one row of ``seq_len`` tokens through the whole model: ``layers`` (all blocks,
    or with ``activation_checkpointing`` their inputs plus one block recomputed), ``head`` (the final
    norm's and unembedding's inputs) and ``logits`` (module docstring). ``per_block``: a
    `block_bytes_per_row` already measured."""
    if per_block is None:
        per_block = block_bytes_per_row(config, seq_len, dtype=dtype)
    if activation_checkpointing:
        layers = config.n_layers * seq_len * config.d_model * 4 + per_block
    else:
        layers = config.n_layers * per_block
    head = 3 * seq_len * config.d_model * 4  # the final norm's input and output, the unembedding's input
    logits = seq_len * config.d_vocab * (4 + 4 + (2 if dtype == torch.bfloat16 else 4))
    return {"layers": int(layers), "head": int(head), "logits": int(logits)}


@dataclass(frozen=True)
class MemoryPlan:
    """The per-device memory of a run (bytes; module docstring), whether it fits, and what would."""

    parameters: int
    nproc: int
    sharded: bool
    rows_per_device: int
    micro_batch: int
    seq_len: int
    dtype: str
    activation_checkpointing: bool
    device_bytes: int
    per_device: dict = field(default_factory=dict)
    per_row: dict = field(default_factory=dict)
    advice: str = ""

    @property
    def total(self) -> int:
        return sum(self.per_device.values())

    @property
    def usable(self) -> int:
        return int(USABLE * self.device_bytes)

    @property
    def fits(self) -> bool:
        return self.total <= self.usable

    def table(self) -> str:
        """The plan as lines of text (GiB)."""
        g = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
        lines = [f"parameters      {self.parameters / 1e6:,.1f} M over {self.nproc} process(es) "
                 f"({'FSDP2-sharded' if self.sharded else 'whole on each'}); {self.dtype} compute; "
                 f"{self.rows_per_device} row(s) of {self.seq_len} tokens per device, {self.micro_batch} per "
                 f"forward{'; activation checkpointing' if self.activation_checkpointing else ''}",
                 "per row         " + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in self.per_row.items()),
                 "per device:"]
        lines += [f"  {name:14s}{g(value)}" for name, value in self.per_device.items()]
        verdict = "fits" if self.fits else "does NOT fit"
        lines.append(f"  {'total':14s}{g(self.total)}  of {self.device_bytes / GIB:.1f} GiB per device "
                     f"({g(self.usable).strip()} usable, {int(USABLE * 100)}%): {verdict}")
        if self.advice:
            lines.append(self.advice)
        return "\n".join(lines)


def _parts(config: CompressedConfig, n_params: int, nproc: int, sharded: bool, dtype, micro: int,
           per_row: dict) -> dict[str, int]:
    shard = nproc if sharded else 1
    parts = {"parameters": 4 * n_params // shard, "gradients": 4 * n_params // shard,
             "optimizer": 8 * n_params // shard}
    if sharded and (dtype is not None or nproc > 1):  # the root's and two blocks' gathered parameters
        root = config.d_vocab * config.d_model
        block = (n_params - root) / max(1, config.n_layers)
        parts["working copies"] = int((2 if dtype is not None else 4) * (root + 2 * block) + 4 * 2 * block)
    elif dtype is not None:
        parts["working copies"] = 2 * n_params
    parts["activations"] = micro * (per_row["layers"] + per_row["head"])
    parts["logits"] = micro * per_row["logits"]
    return parts


def plan_memory(config: CompressedConfig, tc, *, nproc: int = 1, device_gib: Optional[float] = None,
                device_type: str = "cuda") -> MemoryPlan:
    """The per-device memory of pretraining ``config`` with recipe ``tc`` (`PretrainConfig`) on ``nproc``
    processes, against ``device_gib`` GiB per device (default: this machine's CUDA device, else
    `DEFAULT_GPU_GIB`), in the precision ``tc`` gives ``device_type``; with `MemoryPlan.advice` naming the
    micro-batch and/or activation checkpointing that fits when the run as asked does not."""
    check_int("nproc", nproc, 1)
    share, micro = tc.rows_per_forward(nproc)
    if device_gib is None:
        device_gib = (torch.cuda.get_device_properties(0).total_memory / GIB if torch.cuda.is_available()
                      else DEFAULT_GPU_GIB)
    device_gib = check_real("device_gib", device_gib, 0.0, low_open=True, why=" (GiB per device)")
    dtype = tc.compute_dtype(device_type)
    sharded = nproc > 1 or tc.force_fsdp
    n_params = parameter_count(config)
    device_bytes = int(device_gib * GIB)
    per_block = block_bytes_per_row(config, tc.seq_len, dtype=dtype)
    rows = {ac: activation_bytes_per_row(config, tc.seq_len, dtype=dtype, activation_checkpointing=ac,
                                         per_block=per_block) for ac in (False, True)}
    parts = _parts(config, n_params, nproc, sharded, dtype, micro, rows[tc.activation_checkpointing])
    plan = MemoryPlan(n_params, nproc, sharded, share, micro, tc.seq_len, "bf16" if dtype else "fp32",
                      tc.activation_checkpointing, device_bytes, parts, rows[tc.activation_checkpointing])
    if plan.fits:
        return plan
    usable = plan.usable
    options = []
    for ac in ((False, True) if not tc.activation_checkpointing else (True,)):
        fitting = [m for m in range(share, 0, -1) if share % m == 0
                   and sum(_parts(config, n_params, nproc, sharded, dtype, m, rows[ac]).values()) <= usable]
        if fitting:
            total = sum(_parts(config, n_params, nproc, sharded, dtype, fitting[0], rows[ac]).values())
            flags = " ".join(f for f in ((f"--micro-batch {fitting[0]}" if fitting[0] != share else ""),
                                         ("--activation-checkpointing" if ac else "")) if f)
            options.append(f"{flags} ({total / GIB:.1f} GiB per device)")
    if options:
        advice = ("would fit with " + "; or ".join(options) + " (gradient accumulation keeps the global batch of "
                  f"{tc.global_batch})")
    else:
        advice = ("even one row per forward with activation checkpointing does not fit: more processes "
                  "(--nproc) shard the weights and optimizer state, a shorter --seq-len shrinks the activations")
    return dataclasses.replace(plan, advice=advice)
