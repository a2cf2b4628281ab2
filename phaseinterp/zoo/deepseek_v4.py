"""Tiny DeepSeek-V4s (the Hugging Face architecture, random init) trained on the zoo's retrieval task.

``build("dsv4-tiny")`` trains ``DeepseekV4ForCausalLM`` from scratch on CPU with the zoo's
task and batch mixture (`phaseinterp.zoo.task.TASK`, periodic rows, the easy-stage curriculum)
and installs it in ``phaseinterp/zoo/checkpoints/<name>`` in HF format (``model.safetensors``
+ ``config.json``, and the task vocabulary's ``tokenizer.json``: `write_tokenizer`) with a
``phaseinterp.json`` sidecar (evaluation task, recipe, command);
``phaseinterp.zoo.load(name)`` / ``phaseinterp.load_hf(path)`` read it. Command:
``phaseinterp zoo build NAME`` (one thread; rerun resumes nothing: runs are short).

What differs from the real models, and why:
- scaled down: d_model 64, 4 query heads of 16 dims (8 rotary), 3 layers (CSA, CSA, HCA),
  2 routed experts (top-1) + a shared one, ``hc_mult`` 2, sliding window 16 (the zoo's local
  window) instead of 128, HCA rate 32 instead of 128 (the prompts have 128 tokens);
- the Lightning Indexer, which gets no gradient through top-k in HF's forward, is trained as in
  DeepSeek's recipe by a KL loss (`phaseinterp.train.deepseek_v4`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Optional, Union

import torch

from phaseinterp._checks import check_int, check_real
from phaseinterp._files import move_into_place
from phaseinterp.errors import MissingPathError, UserInputError
from phaseinterp.models import catalog
from phaseinterp.models.catalog import CHECKPOINT_DIR, HF_MODELS
from phaseinterp.models.hf.config import transformers_v4
from phaseinterp.tasks import KeyValueRetrieval, task_from_dict
from phaseinterp.tasks.hf_tokenizer import write_vocab_tokenizer
from phaseinterp.train.deepseek_v4 import train_tiny
from phaseinterp.train.recipe import Recipe
from phaseinterp.zoo.task import TASK

CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"


@dataclass(frozen=True)
class TinyRecipe(Recipe):
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
    # FP8-native (as a DeepSeek-V4 release): the weights the release stores in FP8 are fake-quantized
    # in training (straight-through, the exporter's quantizer) and saved on the FP8 grid
    fp8_weights: bool = False
    betas: ClassVar[tuple[float, float]] = (0.9, 0.95)  # AdamW's; not a field, so not in the shipped records

    def __post_init__(self) -> None:
        """The optimizer fields (`Recipe._check_optimizer`), the architecture and training integers and the
        real-number knobs in range, each stored as the Python number it equals (the recipe is written to the
        shipped ``phaseinterp.json``)."""
        self._check_optimizer()
        for name in ("csa_rate", "hca_rate", "hidden_size", "num_attention_heads", "head_dim", "q_lora_rank",
                     "o_groups", "o_lora_rank", "moe_intermediate_size", "n_routed_experts", "hc_mult",
                     "hc_sinkhorn_iters", "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
                     "batch_size", "eval_every", "probe_per_residue"):
            self._store(name, check_int(name, getattr(self, name), 1))
        self._check_periodic_block()
        for name, low, high, low_open, high_open, why in (
                ("partial_rotary_factor", 0.0, 1.0, True, False, " (the share of head_dim that is rotary)"),
                ("periodic_fraction", 0.0, 1.0, False, True, " (the share of periodic rows per batch)"),
                ("easy_until", 0.0, 1.0, False, False, " (the share of the steps in the easy stage)"),
                ("dense_fraction", 0.0, 1.0, False, False, " (the share of the steps with a dense indexer)"),
                ("indexer_loss_weight", 0.0, float("inf"), False, True, "")):
            self._store(name, check_real(name, getattr(self, name), low, high, low_open=low_open,
                                         high_open=high_open, why=why))

    @property
    def command(self) -> str:
        return catalog.command(self.name)

    def hf_config(self, vocab_size: int):
        n = len(self.layer_types)
        return transformers_v4().DeepseekV4Config(
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
        return KeyValueRetrieval(**{**TASK, **self.task})


RECIPES: dict[str, TinyRecipe] = {  # descriptions: the catalog's (`phaseinterp.models.catalog.HF_MODELS`)
    name: TinyRecipe(name, HF_MODELS[name], **knobs)
    for name, knobs in (("dsv4-tiny", dict(csa_rate=4)), ("dsv4.1-tiny", dict(csa_rate=2, index_topk=16)),
                        ("dsv4-tiny-fp8", dict(csa_rate=4, fp8_weights=True)))
}


def build(name: str, out_dir: Union[str, Path, None] = None, *, install: bool = True, progress: bool = True,
          threads: Optional[int] = 1, steps: Optional[int] = None) -> Path:
    """Train ``name`` (one of `RECIPES`) and (``install=True``) copy it into the package's checkpoints.
    ``steps``: train that many steps instead of the recipe's (a quick check, not the shipped model)."""
    if name not in RECIPES:
        raise UserInputError(f"unknown tiny DeepSeek-V4 recipe {name!r}; known: {sorted(RECIPES)}")
    if steps is not None:
        check_int("steps", steps, 1, why=f" (or None: the recipe's {RECIPES[name].steps})")
    if threads is not None:
        torch.set_num_threads(check_int("threads", threads, 1, why=" (or None: torch's default)"))
    run_dir = Path(out_dir) if out_dir is not None else Path("runs") / "zoo" / name
    recipe = RECIPES[name] if steps is None else replace(RECIPES[name], steps=steps)
    train_tiny(recipe, run_dir, progress=progress)
    if install:
        install_run(name, run_dir)
    return run_dir / "final"


def install_run(name: str, run_dir: Union[str, Path]) -> Path:
    """Copy a finished run's ``final/`` (+ ``curves.csv``) into the package checkpoints, atomically (temp + rename)."""
    run_dir = Path(run_dir)
    source = run_dir / "final"
    if not (source / "config.json").is_file():
        raise MissingPathError(f"{source} holds no finished model (no config.json)")
    target, tmp = CHECKPOINT_DIR / name, CHECKPOINT_DIR / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(source, tmp)
    shutil.copy(run_dir / "curves.csv", tmp / "curves.csv")
    write_tokenizer(tmp)
    move_into_place(tmp, target)
    return target


def write_tokenizer(folder: Union[str, Path]) -> list[Path]:
    """Write the tokenizer of a tiny DeepSeek-V4 folder (``tokenizer.json`` + ``tokenizer_config.json``:
    `phaseinterp.tasks.hf_tokenizer`, id i = token i of the vocabulary of the task in its
    ``phaseinterp.json``), so ``AutoTokenizer.from_pretrained(folder)`` and tools built on it (lm-eval,
    vLLM) read it as a plain Hugging Face model. The weights and their files are not touched."""
    folder = Path(folder)
    try:
        task = json.loads((folder / "phaseinterp.json").read_text())["metadata"]["task"]
        n_ctx = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise MissingPathError(f"{folder} is not a tiny DeepSeek-V4 folder with a stored task (phaseinterp.json) "
                               f"and config.json ({err})") from None
    return write_vocab_tokenizer(task_from_dict(task).vocab, folder, n_ctx)


def available() -> list[str]:
    """The tiny DeepSeek-V4s whose checkpoints ship (HF format; load with `phaseinterp.zoo.load`)."""
    return catalog.available(RECIPES)


def load(name: str, device=None):
    """A shipped tiny DeepSeek-V4 (`HookedDeepseekV4`, eval mode, evaluation task in ``.metadata``)."""
    if not isinstance(name, str) or name not in RECIPES:
        raise UserInputError(f"unknown tiny DeepSeek-V4 {name!r}; known: {sorted(RECIPES)}")
    return catalog.load(name, device=device)
