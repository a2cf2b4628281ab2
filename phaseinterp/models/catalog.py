"""The zoo's catalog: every zoo name (three tables, one per family) with the description ``phaseinterp zoo
list`` prints, its rebuild `command`, which ship (`available`: ``phaseinterp/zoo/checkpoints/<name>/``) and
`load`. Data and a plain load, below the zoo's build recipes (`phaseinterp.zoo`: training, snapshots,
install), so the one loader (`phaseinterp.models.loading`) needs no training; the recipes take their
descriptions from here."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from phaseinterp._checks import check_device, check_name
from phaseinterp.errors import MissingPathError, UserInputError
from phaseinterp.models.hf import load_hf
from phaseinterp.models.transformer import CompressedTransformer

CHECKPOINT_DIR = Path(__file__).parent.parent / "zoo" / "checkpoints"

# Trained by the zoo's one recipe (`phaseinterp.zoo.ENTRIES`), `CompressedTransformer` checkpoints.
OWN_MODELS: dict[str, str] = {
    "w4s4": "compressed, non-overlapping W = S = 4, scalar gates, 2 KV heads",
    "w8s8": "compressed, non-overlapping W = S = 8 (a second stride), scalar gates",
    "w8s4-deepseek": "DeepSeek-V4 overlapping kernel W = 8, S = 4 (kv_proj, gate_proj, position_bias)",
    "full": "full-attention twin: the identical backbone and recipe, no compression (stride 4 is the reference for "
        "folding phases), at the equal-training step with w4s4-equal: the first snapshot at which both have learned "
        "the task (probe mean >= 60%; zoo.equal_training_step)",
    "w4s4-equal": "w4s4's own run at the equal-training step with the full twin (same step as `full`; "
        "zoo.equal_training_step), before its curriculum's easy stage ends",
    "full-final": "the full-attention twin's final step (1500), the same step as w4s4: the final-step pair",
    "w8s8-vector": "compressed W = S = 8 with per-channel (vector) gates",
    "w6s6": "compressed, non-overlapping W = S = 6, scalar gates",
    "w6s6-4kv": "compressed W = S = 6, scalar gates, FOUR KV heads (one per query head): enough (layer, KV head) units "
        "to cover the six phases",
    "w8s8-4kv": "compressed W = S = 8, scalar gates, FOUR KV heads",
    "w4s4-staggered": "W = S = 4, 2 KV heads, scalar gates, staggered window grids (KV head h compresses windows "
        "starting at j*S + h*S/2): the remedy twin of w4s4",
    "w4s4-1kv": "W = S = 4 with ONE KV head, scalar gates, per-slot payload maps",
    "w4s4-1kv-shared": "W = S = 4, ONE KV head, scalar gates, payload shared across slots (C_i = the K/V projections): "
        "the gate-cycling model, since a shifted gate then still reads a payload map trained for every slot",
    "deep12-w8s8-1kv-shared": "12 layers, ONE KV head per layer, W = S = 8, scalar gates, payload shared across slots "
        "(as DeepSeek's kv_proj): the paper-depth model (ablate(model, layer=9), gate cycling on 7 non-boundary "
        "phases), its final step (3000 of the DEEP_TRAIN schedule)",
    "deep12-full": "full-attention twin of deep12-w8s8-1kv-shared: the identical 12-layer, one-KV-head backbone and "
        "recipe, no compression (stride 8 is the reference for folding phases); ships its final step, the same step as "
        "deep12-w8s8-1kv-shared: the final-step pair",
    "deep12-w8s8-1kv-shared-equal": "deep12-w8s8-1kv-shared's own run at the equal-training step with "
        "deep12-full-equal (zoo.equal_training_step: the first snapshot at which both runs' probe mean is >= 60%); the "
        "deep model examples/ablate_layer.py and notebook 03 take apart",
    "deep12-full-equal": "deep12-full's own run at the equal-training step with deep12-w8s8-1kv-shared-equal "
        "(zoo.equal_training_step)",
    "deep12-w8s8-1kv-shared-seed1-equal": "deep12-w8s8-1kv-shared-equal's second seed: the identical recipe with model "
        "and data seed 1, at its own equal-training step with deep12-full-seed1-equal (zoo.equal_training_step)",
    "deep12-full-seed1-equal": "deep12-full-equal's second seed (seed 1), at the equal-training step with "
        "deep12-w8s8-1kv-shared-seed1-equal",
    "deep12-w8s8-1kv-shared-seed2-equal": "deep12-w8s8-1kv-shared-equal with model and data seed 2 (the identical "
        "recipe), at its own equal-training step with deep12-full-seed2-equal",
    "deep12-full-seed2-equal": "deep12-full-equal with seed 2, at the equal-training step with "
        "deep12-w8s8-1kv-shared-seed2-equal",
    "deep12-w8s8-1kv-shared-seed3-equal": "deep12-w8s8-1kv-shared-equal with model and data seed 3 (the identical "
        "recipe), at its own equal-training step with deep12-full-seed3-equal",
    "deep12-full-seed3-equal": "deep12-full-equal with seed 3, at the equal-training step with "
        "deep12-w8s8-1kv-shared-seed3-equal",
    "w12s12-4kv": "compressed, non-overlapping W = S = 12, scalar gates, FOUR KV heads: the fourth stride of the "
        "paper's period claim",
    "w4s4-post": "w4s4 (its final step) post-trained: POST_TRAIN's 500 steps of retrieval-only rows (no periodic rows, "
        "no curriculum) at a third of the learning rate; the same architecture and evaluation task; ships its final "
        "step",
    "full-s12": "full-attention twin of w12s12-4kv: the identical backbone (four KV heads) and recipe, no compression, "
        "stride 12 as the reference for folding phases; final step",
}

# Pretrained on natural text by benchmarks/pretrain_python_code.py (`phaseinterp.zoo.TEXT_ENTRIES`).
TEXT_MODELS: dict[str, str] = {
    "py-w4s4": "natural text: 2 layers, W = S = 4, pretrained on Python source (49.2M tokens, seed 0); task: "
        "identifier recall in held-out code",
    "py-full": "natural text: py-w4s4's full-attention twin (same backbone, recipe and seed, no compression)",
    "py-w8s8": "natural text: py-w4s4 with W = S = 8 (same backbone, recipe and seed); task: identifier recall in "
        "held-out code",
}

# Hugging Face DeepSeek-V4s (`phaseinterp.zoo.deepseek_v4.RECIPES`), loaded with `load_hf`.
HF_MODELS: dict[str, str] = {
    "dsv4-tiny": "tiny DeepSeek-V4 (HF DeepseekV4ForCausalLM): CSA rate 4 (two-half W = 8 windows, Lightning Indexer "
        "top-8), CSA, HCA rate 32; 3 layers, d_model 64",
    "dsv4.1-tiny": "tiny V4.1-shaped DeepSeek-V4 (HF DeepseekV4ForCausalLM): CSA rate 2 (W = 4), indexer top-16, CSA, "
        "HCA rate 32; 3 layers, d_model 64",
    "dsv4-tiny-fp8": "dsv4-tiny trained FP8-native (as a DeepSeek-V4 release): the weights the release stores in FP8 "
        "e4m3 (128 x 128 blocks, power-of-two scales) are fake-quantized in training and shipped on that grid, so an "
        "FP8 export is lossless",
}

MODELS: dict[str, str] = {**OWN_MODELS, **TEXT_MODELS, **HF_MODELS}  # every zoo name -> its description


def command(name: str) -> str:
    """The command that rebuilds zoo model ``name``."""
    if name in TEXT_MODELS:
        return (f"python benchmarks/pretrain_python_code.py train --root RUNS && python "
                f"benchmarks/pretrain_python_code.py install --root RUNS --name {name}")
    return f"phaseinterp zoo build {name}"


def available(names: Iterable[str] = MODELS) -> list[str]:
    """Those of ``names`` (default: every zoo name, in the tables' order) whose checkpoints ship with this
    installation."""
    return [name for name in names if (CHECKPOINT_DIR / name / "config.json").is_file()]


def rows() -> list[tuple[str, bool, str, str]]:
    """``(name, shipped, description, rebuild command)`` for every zoo model (``phaseinterp zoo list``)."""
    shipped = set(available())
    return [(name, name in shipped, description, command(name)) for name, description in MODELS.items()]


def load(name: str, device=None):
    """Shipped zoo model ``name`` (one of `available()`; a known one that does not ship raises
    FileNotFoundError naming its `command`) on ``device`` (default: cpu), in eval mode with its task in
    ``.metadata``: a ``CompressedTransformer``, or a `HookedDeepseekV4` for the HF-format DeepSeek-V4s."""
    device = check_device(device)  # before reading any weights
    if not isinstance(name, str):
        raise UserInputError(f"name={name!r} is not a zoo name (a string; `phaseinterp zoo list`)")
    check_name("name", name, list(MODELS), shown=f"unknown zoo model {name!r}", what="a zoo model",
               where="`phaseinterp zoo list` lists them")
    path = CHECKPOINT_DIR / name
    if not (path / "config.json").is_file():
        raise MissingPathError(f"zoo model {name!r} is known but its checkpoint is not in {path}; build it with "
                               f"`{command(name)}`")
    if name in HF_MODELS:
        model = load_hf(path, name=name)
        return (model if device is None else model.to(device)).eval()
    return CompressedTransformer.from_pretrained(path, device=device).eval()


__all__ = ["CHECKPOINT_DIR", "HF_MODELS", "MODELS", "OWN_MODELS", "TEXT_MODELS", "available", "command", "load", "rows"]
