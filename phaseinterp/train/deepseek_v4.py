"""Training loop of the tiny Hugging Face DeepSeek-V4s (recipes in `phaseinterp.zoo.deepseek_v4`).

`train_tiny(recipe, out_dir)` trains ``DeepseekV4ForCausalLM`` on CPU with the zoo's task mixture. The
Lightning Indexer is trained by a KL loss to the main attention's mass on the compressed entries (summed
over heads, detached), every closed entry kept for the first ``dense_fraction`` of the run, then ``index_topk``.
``recipe.fp8_weights``: the weights a release stores in FP8 go through straight-through fake
quantization (the exporter's quantizer) and are snapped onto that grid at the end."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Union

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize

from phaseinterp._files import atomic_write_text
from phaseinterp.models.hf import from_hf
from phaseinterp.models.hf.config import CSA, transformers_v4
from phaseinterp.models.hf.export import fp8_parameter_parts, fp8_roundtrip_parts
from phaseinterp.train.compressed import TrainingDiverged, residue_rows, training_batch
from phaseinterp.train.recipe import adamw


def _set_index_topk(hf_model, k: int) -> None:
    hf_model.config.index_topk = k
    for layer in hf_model.model.layers:
        comp = layer.self_attn.compressor
        if getattr(comp, "indexer", None) is not None:
            comp.indexer.index_topk = k


def _indexer_kl(store: dict):
    """KL(attention mass on entries || indexer softmax), mean over queries that see an entry."""
    losses = []
    for layer, pattern in store["pattern"].items():
        scores = store["scores"][layer]  # [batch, pos, entry]
        n_entries = scores.shape[-1]  # the pattern's key axis ends with the entries (docs/hooks.md)
        mass = pattern[..., pattern.shape[-1] - n_entries:].sum(1).detach()  # [batch, pos, entry], summed over heads
        total = mass.sum(-1, keepdim=True)
        visible = torch.isfinite(scores).any(-1) & (total[..., 0] > 0)
        if not visible.any():
            continue
        p = mass[visible] / total[visible]
        log_q = torch.log_softmax(scores[visible].float(), dim=-1)
        log_q = torch.where(p > 0, log_q, torch.zeros_like(log_q))
        losses.append((p * (torch.log(p.clamp_min(1e-12)) - log_q)).sum(-1).mean())
    return torch.stack(losses).mean() if losses else None


def _fake_fp8(parts):
    """A parametrization module: straight-through fake quantization of one HF parameter's FP8 parts
    (forward value on the FP8 grid, gradient passed to the float32 master weight unchanged)."""
    class FakeFP8(torch.nn.Module):
        def forward(self, w):
            return w + (fp8_roundtrip_parts(w, parts) - w).detach()

    return FakeFP8()


def _fp8_parametrize(hf_model) -> list:
    """Register `_fake_fp8` on every parameter with FP8 parts; returns ``[(module, attr, parts), ...]``."""
    named = dict(hf_model.named_parameters())
    parts = fp8_parameter_parts({n: p.shape for n, p in named.items()}, hf_model.config)
    done = []
    for name, index in parts.items():
        module_name, _, attr = name.rpartition(".")
        module = hf_model.get_submodule(module_name)
        parametrize.register_parametrization(module, attr, _fake_fp8(index))
        done.append((module, attr, index))
    return done


def _fp8_snap(parametrized: list) -> None:
    """Remove the parametrizations and store the weights on the FP8 grid (``fp8_roundtrip``)."""
    for module, attr, index in parametrized:
        parametrize.remove_parametrizations(module, attr, leave_parametrized=False)
        with torch.no_grad():
            param = getattr(module, attr)
            param.copy_(fp8_roundtrip_parts(param, index))


def train_tiny(recipe, out_dir: Union[str, Path], *, progress: bool = True, log_every: int = 25):
    """Train ``recipe`` from scratch; writes ``final/`` (HF format + sidecar), ``log.csv``, ``curves.csv``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    task = recipe.task_object()
    vocab = task.vocab.size
    torch.manual_seed(recipe.seed)
    hf_model = transformers_v4().DeepseekV4ForCausalLM(recipe.hf_config(vocab))
    with torch.no_grad():  # HF inits position_bias and sinks at 0; small noise breaks slot symmetry
        gen = torch.Generator().manual_seed(recipe.seed)
        for name, p in hf_model.named_parameters():
            if name.endswith("position_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    fp8 = _fp8_parametrize(hf_model) if getattr(recipe, "fp8_weights", False) else []
    model = from_hf(hf_model, name=recipe.name)
    dense_k = task.seq_len  # more than any number of closed entries: the indexer keeps all
    opt = adamw(hf_model, recipe, embedding="embed")
    store: dict[str, dict] = {"pattern": {}, "scores": {}}
    hooks = [(f"blocks.{layer}.attn.{name}", lambda t, hook, layer=layer, key=key: store[key].__setitem__(layer, t))
             for layer, kind in enumerate(hf_model.config.layer_types) if kind == CSA
             for key, name in (("pattern", "hook_pattern"), ("scores", "compressor.indexer.hook_scores"))]
    probe = task.generate(recipe.probe_per_residue, seed=12345, strict=False)
    rows, curves = [], []
    t0 = time.time()
    for step in range(recipe.steps):
        dense = step < recipe.dense_fraction * recipe.steps
        _set_index_topk(hf_model, dense_k if dense else recipe.index_topk)
        stage = ({"n_records": (4, 24), "n_queries": None} if step < recipe.easy_until * recipe.steps
                 else {"n_queries": 8})
        tokens, targets, mask, n_task = training_batch(task, recipe, step, stage)
        for group in opt.param_groups:
            group["lr"] = recipe.lr_at(step)
        model.train()
        with model.hooks(fwd_hooks=hooks):
            logits = model(tokens)
        loss = F.cross_entropy(logits[mask].float(), targets[mask])
        kl = _indexer_kl(store)
        total = loss if kl is None else loss + recipe.indexer_loss_weight * kl
        if not torch.isfinite(total):
            raise TrainingDiverged(f"loss became {total.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(hf_model.parameters(), recipe.grad_clip)
        opt.step()
        store["pattern"].clear()
        store["scores"].clear()
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
            new = residue_rows(probe.meta["residue"].to_numpy(), (pred == probe.answer).numpy(), recipe.csa_rate,
                               step=done)
            curves.extend(new)
            by_phase = pd.DataFrame(new).groupby("phase").accuracy.mean()
            if progress:
                print(f"step {done} probe by phase {np.round(by_phase.to_numpy(), 2).tolist()} "
                      f"({time.time() - t0:.0f}s)", flush=True)
        if progress and done % log_every == 0:
            recent = rows[-log_every:]
            print(f"step {done} loss {np.mean([r['loss'] for r in recent]):.3f} "
                  f"kl {np.nanmean([r['indexer_kl'] for r in recent]):.3f} "
                  f"acc {np.mean([r['accuracy'] for r in recent]):.2f} ({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    if fp8:
        _fp8_snap(fp8)
    _set_index_topk(hf_model, recipe.index_topk)
    model.metadata.update({
        "task": task.to_dict(), "task_type": type(task).__name__, "zoo_name": recipe.name,
        "description": recipe.description, "command": recipe.command, "step": recipe.steps,
        "recipe": json.loads(json.dumps(asdict(recipe), default=list)),
    })
    model.save_pretrained(out / "final", overwrite=True)  # a rebuild replaces its own run's final model
    atomic_write_text(out / "log.csv", pd.DataFrame(rows).to_csv(index=False))  # whole or not at all
    atomic_write_text(out / "curves.csv", pd.DataFrame(curves).to_csv(index=False))
    return model
