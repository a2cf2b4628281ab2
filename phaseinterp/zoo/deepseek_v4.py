"""Tiny DeepSeek-V4s (the Hugging Face architecture, random init) trained on the zoo's retrieval task.

``build("dsv4-tiny")`` trains ``DeepseekV4ForCausalLM`` from scratch on CPU with the zoo's
task and batch mixture (`phaseinterp.zoo.TASK`, periodic rows, the easy-stage curriculum)
and installs it in ``phaseinterp/zoo/checkpoints/<name>`` in HF format (``model.safetensors``
+ ``config.json``) with a ``phaseinterp.json`` sidecar (evaluation task, recipe, command);
``phaseinterp.zoo.load(name)`` / ``phaseinterp.load_hf(path)`` read it. Command:
``python -m phaseinterp.zoo.deepseek_v4 NAME`` (one thread; rerun resumes nothing: runs are short).

What differs from the real models, and why:
- scaled down: d_model 64, 4 query heads of 16 dims (8 rotary), 3 layers (CSA, CSA, HCA),
  2 routed experts (top-1) + a shared one, ``hc_mult`` 2, sliding window 16 (the zoo's local
  window) instead of 128, HCA rate 32 instead of 128 (the prompts have 128 tokens);
- the Lightning Indexer gets no gradient through top-k in HF's forward. As in DeepSeek's
  recipe it is trained by a KL loss to the main attention's mass on the compressed entries
  (summed over heads, detached), with every closed entry kept during the first
  ``dense_fraction`` of the run, then ``index_topk`` entries.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from phaseinterp.errors import UserInputError

CHECKPOINT_DIR = Path(__file__).parent / "checkpoints"
CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"


@dataclass(frozen=True)
class TinyRecipe:
    """One tiny HF DeepSeek-V4 zoo model: architecture knobs and training settings."""

    name: str
    description: str
    csa_rate: int = 4
    hca_rate: int = 32
    layer_types: tuple[str, ...] = (CSA, CSA, HCA)
    hidden_size: int = 64
    num_attention_heads: int = 4
    head_dim: int = 16
    partial_rotary_factor: float = 0.5
    q_lora_rank: int = 32
    o_groups: int = 2
    o_lora_rank: int = 32
    moe_intermediate_size: int = 128
    n_routed_experts: int = 2
    hc_mult: int = 2
    hc_sinkhorn_iters: int = 5
    sliding_window: int = 16
    index_n_heads: int = 2
    index_head_dim: int = 16
    index_topk: int = 8
    steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    periodic_fraction: float = 0.5
    periodic_block: tuple[int, int] = (4, 48)
    easy_until: float = 0.6  # curriculum: 4-24 records and a query section full of queries
    dense_fraction: float = 0.5  # indexer keeps every closed entry until then
    indexer_loss_weight: float = 0.1
    seed: int = 0
    eval_every: int = 100
    probe_per_residue: int = 8
    task: dict[str, Any] = field(default_factory=dict)  # overrides of phaseinterp.zoo.TASK

    @property
    def command(self) -> str:
        return f"python -m phaseinterp.zoo.deepseek_v4 {self.name}"

    def hf_config(self, vocab_size: int):
        from transformers import DeepseekV4Config

        n = len(self.layer_types)
        return DeepseekV4Config(
            vocab_size=vocab_size, hidden_size=self.hidden_size, num_hidden_layers=n,
            num_attention_heads=self.num_attention_heads, head_dim=self.head_dim,
            partial_rotary_factor=self.partial_rotary_factor, q_lora_rank=self.q_lora_rank,
            o_groups=self.o_groups, o_lora_rank=self.o_lora_rank, moe_intermediate_size=self.moe_intermediate_size,
            n_routed_experts=self.n_routed_experts, num_experts_per_tok=1, n_shared_experts=1,
            mlp_layer_types=["moe"] * n, layer_types=list(self.layer_types),
            compress_rates={CSA: self.csa_rate, HCA: self.hca_rate}, hc_mult=self.hc_mult,
            hc_sinkhorn_iters=self.hc_sinkhorn_iters, sliding_window=self.sliding_window,
            index_n_heads=self.index_n_heads, index_head_dim=self.index_head_dim, index_topk=self.index_topk,
            max_position_embeddings=256, attn_implementation="eager", bos_token_id=None, eos_token_id=None,
            tie_word_embeddings=False,
        )

    def task_object(self):
        from phaseinterp.tasks import KeyValueRetrieval
        from phaseinterp.zoo import TASK

        return KeyValueRetrieval(**{**TASK, **self.task})

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


RECIPES: dict[str, TinyRecipe] = {
    r.name: r
    for r in [
        TinyRecipe("dsv4-tiny", "tiny DeepSeek-V4 (HF DeepseekV4ForCausalLM): CSA rate 4 (two-half W = 8 "
                   "windows, Lightning Indexer top-8), CSA, HCA rate 32; 3 layers, d_model 64", csa_rate=4),
        TinyRecipe("dsv4.1-tiny", "tiny V4.1-shaped DeepSeek-V4 (HF DeepseekV4ForCausalLM): CSA rate 2 "
                   "(W = 4), indexer top-16, CSA, HCA rate 32; 3 layers, d_model 64", csa_rate=2, index_topk=16),
    ]
}


def _set_index_topk(hf_model, k: int) -> None:
    hf_model.config.index_topk = k
    for layer in hf_model.model.layers:
        comp = layer.self_attn.compressor
        if getattr(comp, "indexer", None) is not None:
            comp.indexer.index_topk = k


def _indexer_kl(store: dict, T: int):
    """KL(attention mass on entries || indexer softmax), mean over queries that see an entry."""
    import torch

    losses = []
    for layer, pattern in store["pattern"].items():
        scores = store["scores"][layer]  # [batch, pos, entry]
        mass = pattern[..., T:].sum(1).detach()  # [batch, pos, entry], summed over heads
        total = mass.sum(-1, keepdim=True)
        visible = torch.isfinite(scores).any(-1) & (total[..., 0] > 0)
        if not visible.any():
            continue
        p = mass[visible] / total[visible]
        log_q = torch.log_softmax(scores[visible].float(), dim=-1)
        log_q = torch.where(p > 0, log_q, torch.zeros_like(log_q))
        losses.append((p * (torch.log(p.clamp_min(1e-12)) - log_q)).sum(-1).mean())
    return torch.stack(losses).mean() if losses else None


def train_tiny(recipe: TinyRecipe, out_dir: Union[str, Path], *, progress: bool = True, log_every: int = 25):
    """Train ``recipe`` from scratch; writes ``final/`` (HF format + sidecar), ``log.csv``, ``curves.csv``."""
    import numpy as np
    import pandas as pd
    import torch
    import torch.nn.functional as F
    from transformers import DeepseekV4ForCausalLM

    from phaseinterp.models.hf import from_hf
    from phaseinterp.train import periodic_rows

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    task = recipe.task_object()
    vocab = task.vocab.size
    torch.manual_seed(recipe.seed)
    hf_model = DeepseekV4ForCausalLM(recipe.hf_config(vocab))
    with torch.no_grad():  # HF inits position_bias and sinks at 0; small noise breaks slot symmetry
        gen = torch.Generator().manual_seed(recipe.seed)
        for name, p in hf_model.named_parameters():
            if name.endswith("position_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model = from_hf(hf_model, name=recipe.name)
    dense_k = task.seq_len  # more than any number of closed entries: the indexer keeps all
    decay = [p for n, p in hf_model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in hf_model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=recipe.lr, betas=(0.9, 0.95))
    store: dict[str, dict] = {"pattern": {}, "scores": {}}
    hooks = []
    for layer, kind in enumerate(hf_model.config.layer_types):
        if kind != CSA:
            continue

        def keep(t, hook, layer=layer, key="pattern"):
            store[key][layer] = t

        hooks.append((f"blocks.{layer}.attn.hook_pattern", keep))
        hooks.append((f"blocks.{layer}.attn.compressor.indexer.hook_scores",
                      lambda t, hook, layer=layer: store["scores"].__setitem__(layer, t)))
    probe = task.generate(recipe.probe_per_residue, seed=12345, strict=False)
    rows, curves = [], []
    t0 = time.time()
    n_periodic = int(round(recipe.periodic_fraction * recipe.batch_size))
    for step in range(recipe.steps):
        dense = step < recipe.dense_fraction * recipe.steps
        _set_index_topk(hf_model, dense_k if dense else recipe.index_topk)
        step_seed = recipe.seed * 1_000_003 + step
        stage = ({"n_records": (4, 24), "n_queries": None} if step < recipe.easy_until * recipe.steps
                 else {"n_queries": 8})
        batch = task.sample_train(recipe.batch_size - n_periodic, step_seed, **stage)
        gen = torch.Generator().manual_seed(step_seed)
        p_tok, p_tgt, p_mask = periodic_rows(n_periodic, task.seq_len, vocab, recipe.periodic_block, gen,
                                             low=len(task.vocab.specials))
        tokens = torch.cat([batch.tokens, p_tok])
        targets = torch.cat([batch.targets, p_tgt])
        mask = torch.cat([batch.answer_mask, p_mask])
        for group in opt.param_groups:
            group["lr"] = recipe.lr_at(step)
        model.train()
        with model.hooks(fwd_hooks=hooks):
            logits = model(tokens)
        loss = F.cross_entropy(logits[mask].float(), targets[mask])
        kl = _indexer_kl(store, task.seq_len)
        total = loss if kl is None else loss + recipe.indexer_loss_weight * kl
        if not torch.isfinite(total):
            raise RuntimeError(f"loss became {total.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(hf_model.parameters(), recipe.grad_clip)
        opt.step()
        store["pattern"].clear()
        store["scores"].clear()
        n_task = recipe.batch_size - n_periodic
        with torch.no_grad():
            m = mask[:n_task]
            acc = (logits[:n_task].argmax(-1)[m] == targets[:n_task][m]).float().mean().item()
        rows.append(dict(step=step + 1, loss=loss.item(), indexer_kl=float("nan") if kl is None else kl.item(),
                         accuracy=acc, lr=recipe.lr_at(step), dense_indexer=dense, seconds=time.time() - t0))
        done = step + 1
        if done % recipe.eval_every == 0 or done == recipe.steps:
            model.eval()
            with torch.inference_mode():
                lg = model(probe.tokens)
                pred = lg[torch.arange(lg.shape[0]), probe.answer_pos].argmax(-1)
            correct = (pred == probe.answer).numpy()
            frame = pd.DataFrame({"residue": probe.meta["residue"].to_numpy(), "correct": correct})
            for r, grp in frame.groupby("residue"):
                curves.append(dict(step=done, residue=int(r), phase=int(r) % recipe.csa_rate,
                                   accuracy=float(grp.correct.mean()), n=int(len(grp))))
            by_phase = frame.assign(phase=frame.residue % recipe.csa_rate).groupby("phase").correct.mean()
            if progress:
                print(f"step {done} probe by phase {np.round(by_phase.to_numpy(), 2).tolist()} "
                      f"({time.time() - t0:.0f}s)", flush=True)
        if progress and done % log_every == 0:
            recent = rows[-log_every:]
            print(f"step {done} loss {np.mean([r['loss'] for r in recent]):.3f} "
                  f"kl {np.nanmean([r['indexer_kl'] for r in recent]):.3f} "
                  f"acc {np.mean([r['accuracy'] for r in recent]):.2f} ({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    _set_index_topk(hf_model, recipe.index_topk)
    model.metadata.update({
        "task": task.to_dict(), "task_type": type(task).__name__, "zoo_name": recipe.name,
        "description": recipe.description, "command": recipe.command, "step": recipe.steps,
        "recipe": json.loads(json.dumps(asdict(recipe), default=list)),
    })
    model.save_pretrained(out / "final")
    pd.DataFrame(rows).to_csv(out / "log.csv", index=False)
    pd.DataFrame(curves).to_csv(out / "curves.csv", index=False)
    return model


def build(name: str, out_dir: Union[str, Path, None] = None, *, install: bool = True, progress: bool = True,
          threads: Optional[int] = 1) -> Path:
    """Train ``name`` (one of `RECIPES`) and (``install=True``) copy it into the package's checkpoints."""
    import torch

    if name not in RECIPES:
        raise UserInputError(f"unknown tiny DeepSeek-V4 recipe {name!r}; known: {sorted(RECIPES)}")
    if threads is not None:
        torch.set_num_threads(threads)
    run_dir = Path(out_dir) if out_dir is not None else Path("runs") / "zoo" / name
    train_tiny(RECIPES[name], run_dir, progress=progress)
    if install:
        install_run(name, run_dir)
    return run_dir / "final"


def install_run(name: str, run_dir: Union[str, Path]) -> Path:
    """Copy a finished run's ``final/`` (+ ``curves.csv``) into the package checkpoints, atomically (temp + rename)."""
    run_dir = Path(run_dir)
    source = run_dir / "final"
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} holds no finished model (no config.json)")
    target, tmp = CHECKPOINT_DIR / name, CHECKPOINT_DIR / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(source, tmp)
    shutil.copy(run_dir / "curves.csv", tmp / "curves.csv")
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def available() -> list[str]:
    """The tiny DeepSeek-V4s whose checkpoints ship (HF format; load with `phaseinterp.zoo.load`)."""
    return [name for name in RECIPES if (CHECKPOINT_DIR / name / "config.json").is_file()]


def load(name: str, device=None):
    """A shipped tiny DeepSeek-V4 (`HookedDeepseekV4`, eval mode, evaluation task in ``.metadata``)."""
    from phaseinterp.models.hf import load_hf

    if name not in RECIPES:
        raise UserInputError(f"unknown tiny DeepSeek-V4 {name!r}; known: {sorted(RECIPES)}")
    path = CHECKPOINT_DIR / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"zoo model {name!r} is known but its checkpoint is not in {path}; build it with "
                                f"`{RECIPES[name].command}`")
    model = load_hf(path, name=name)
    if device is not None:
        model.to(device)
    return model


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(RECIPES))
    parser.add_argument("--out", default=None, help="run directory (default runs/zoo/NAME)")
    parser.add_argument("--steps", type=int, default=None, help="override the recipe's step count")
    parser.add_argument("--no-install", action="store_true")
    args = parser.parse_args(argv)
    if args.steps is not None:
        from dataclasses import replace

        RECIPES[args.name] = replace(RECIPES[args.name], steps=args.steps)
    build(args.name, args.out, install=not args.no_install)


if __name__ == "__main__":
    main()
