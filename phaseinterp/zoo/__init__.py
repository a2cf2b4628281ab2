"""The model zoo: small compressed models and their full-attention twin, trained and shipped here.

``available()`` lists them, ``load(name)`` loads one (from the package, `phaseinterp.models.catalog`),
``build(name)`` (``phaseinterp zoo build NAME``) retrains one. Every entry uses ONE recipe (`recipe()`:
backbone, task, curriculum, periodic-row mixture, optimiser, steps); only the attention's compression
changes. Which snapshot ships (rules fixed before training):
- a compressed model ships its final step (``snapshot_step=None``);
- an equal-training pair (``snapshot_step=EQUAL_TRAINING``, ``pair=`` the other model) ships
  `equal_training_step` of the two runs' held-out probe curves: the first snapshot at which BOTH
  models have learned the task (probe mean >= ``LEARNED_MEAN``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import pandas as pd
import torch

from phaseinterp._checks import check_int, check_name, check_real
from phaseinterp._files import atomic_write_text, check_read_path, move_into_place
from phaseinterp.config import CompressedConfig
from phaseinterp.errors import MissingPathError, UserInputError  # the user's paths and names: one line, exit 2
from phaseinterp.models import CompressedTransformer
from phaseinterp.models.catalog import CHECKPOINT_DIR, MODELS, available, command, load
from phaseinterp.models.catalog import rows as catalog  # the zoo's names: `phaseinterp.models.catalog`
from phaseinterp.tasks import IdentifierRecall, KeyValueRetrieval, resolve_task
from phaseinterp.train import TextTokenizer, TrainConfig, train
from phaseinterp.train.corpus import TokenizedCorpus
from phaseinterp.train.pretrain import load_snapshot
from phaseinterp.zoo import deepseek_v4 as hf_zoo
from phaseinterp.zoo.task import TASK

BACKBONE: dict[str, Any] = dict(
    n_ctx=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_head=16, d_mlp=256, local_window=16, qk_norm=False,
)


TRAIN: dict[str, Any] = dict(
    steps=1500, batch_size=32, lr=3e-3, warmup_steps=100, weight_decay=0.1, grad_clip=1.0, seed=0,
    loss_on="answer", periodic_fraction=0.5, periodic_block=(4, 48),
    curriculum=({"until": 0.6, "task": {"n_records": (4, 24), "n_queries": None}},
                {"until": 1.0, "task": {"n_queries": 8}}),
    eval_every=100, checkpoint_every=100, probe_per_residue=8,
    snapshot_steps=tuple(range(100, 1501, 100)),
)


# The paper-depth recipe: the shared recipe with a doubled schedule (the same stages, stretched).
DEEP_TRAIN: dict[str, Any] = dict(steps=3000, snapshot_steps=tuple(range(100, 3001, 100)))

# Post-training: continue a shipped model with no periodic rows and no curriculum (every row a
# retrieval prompt of the final task), a third of the peak learning rate and of the steps.
POST_TRAIN: dict[str, Any] = dict(steps=500, lr=1e-3, warmup_steps=50, periodic_fraction=0.0,
                                  curriculum=({"until": 1.0, "task": {"n_queries": 8}},),
                                  snapshot_steps=tuple(range(100, 501, 100)))

EQUAL_TRAINING = "equal-training"  # snapshot_step value: ship the equal-training step with ``pair``
LEARNED_MEAN = 0.60  # "has learned the task": held-out probe mean accuracy >= 60%


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model: its architecture changes on the shared backbone, and which snapshot ships."""

    name: str
    description: str
    compression: dict[str, Any]
    snapshot_step: Union[int, str, None] = None  # None: the final step; EQUAL_TRAINING: the rule below
    backbone: dict[str, Any] = field(default_factory=dict)  # overrides of BACKBONE (e.g. a deeper model)
    train: dict[str, Any] = field(default_factory=dict)  # overrides of TRAIN
    task: dict[str, Any] = field(default_factory=dict)  # overrides of TASK
    run: Optional[str] = None  # the training run (runs/zoo/<run>) when another entry's run is reused
    pair: Optional[str] = None  # the partner of an equal-training pair (snapshot_step=EQUAL_TRAINING)
    baseline: Optional[str] = None  # a remedy model's twin on the shared window grid (same recipe, seed, step)
    init_from: Optional[str] = None  # post-training: the shipped zoo model whose weights the run starts from

    def model_config(self, vocab_size: int):
        return CompressedConfig(d_vocab=vocab_size, **{**BACKBONE, **self.backbone}, **self.compression)

    def task_object(self):
        return KeyValueRetrieval(**{**TASK, **self.task})

    def train_config(self):
        return TrainConfig(**{**TRAIN, **self.train})

    @property
    def command(self) -> str:
        return command(self.name)


def _entry(name: str, compression: dict[str, Any], **recipe) -> ZooEntry:
    """Zoo entry ``name`` with its recipe, described as the catalog describes it (`phaseinterp.models.catalog`)."""
    return ZooEntry(name, MODELS[name], compression, **recipe)


def _deep_seed_pair(seed: int) -> list[ZooEntry]:
    """The deep equal-training pair with model and data seed ``seed`` (the identical recipe, the same
    snapshot rule): the seed replicates."""
    compressed, twin = f"deep12-w8s8-1kv-shared-seed{seed}-equal", f"deep12-full-seed{seed}-equal"
    backbone, train = dict(n_layers=12, n_kv_heads=1, seed=seed), dict(DEEP_TRAIN, seed=seed)
    return [
        _entry(compressed, dict(compression="gated", window=8, stride=8, gate="scalar", payload="shared"),
               backbone=backbone, train=train, snapshot_step=EQUAL_TRAINING,
               run=f"deep12-w8s8-1kv-shared-seed{seed}", pair=twin),
        _entry(twin, dict(compression=None, window=8, stride=8), backbone=backbone, train=train,
               snapshot_step=EQUAL_TRAINING, run=f"deep12-full-seed{seed}", pair=compressed),
    ]


ENTRIES: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        _entry("w4s4", dict(compression="gated", window=4, stride=4, gate="scalar")),
        _entry("w8s8", dict(compression="gated", window=8, stride=8, gate="scalar")),
        _entry("w8s4-deepseek", dict(compression="deepseek", window=8, stride=4, gate="vector")),
        _entry("full", dict(compression=None, window=4, stride=4), snapshot_step=EQUAL_TRAINING, pair="w4s4"),
        _entry("w4s4-equal", dict(compression="gated", window=4, stride=4, gate="scalar"),
               snapshot_step=EQUAL_TRAINING, run="w4s4", pair="full"),
        _entry("full-final", dict(compression=None, window=4, stride=4), run="full"),
        _entry("w8s8-vector", dict(compression="gated", window=8, stride=8, gate="vector")),
        _entry("w6s6", dict(compression="gated", window=6, stride=6, gate="scalar")),
        _entry("w6s6-4kv", dict(compression="gated", window=6, stride=6, gate="scalar"), backbone=dict(n_kv_heads=4)),
        _entry("w8s8-4kv", dict(compression="gated", window=8, stride=8, gate="scalar"), backbone=dict(n_kv_heads=4)),
        # The remedy: the two KV heads' window grids staggered (offsets 0 and 2); w4s4 its baseline.
        _entry("w4s4-staggered", dict(compression="gated", window=4, stride=4, gate="scalar",
                                      window_offsets="staggered"), baseline="w4s4"),
        _entry("w4s4-1kv", dict(compression="gated", window=4, stride=4, gate="scalar"), backbone=dict(n_kv_heads=1)),
        _entry("w4s4-1kv-shared", dict(compression="gated", window=4, stride=4, gate="scalar", payload="shared"),
               backbone=dict(n_kv_heads=1)),
        # Paper-depth pairs (12 layers, one KV head, DEEP_TRAIN): final-step and equal-training.
        _entry("deep12-w8s8-1kv-shared", dict(compression="gated", window=8, stride=8, gate="scalar", payload="shared"),
               backbone=dict(n_layers=12, n_kv_heads=1), train=DEEP_TRAIN),
        _entry("deep12-full", dict(compression=None, window=8, stride=8), backbone=dict(n_layers=12, n_kv_heads=1),
               train=DEEP_TRAIN),
        _entry("deep12-w8s8-1kv-shared-equal",
               dict(compression="gated", window=8, stride=8, gate="scalar", payload="shared"),
               backbone=dict(n_layers=12, n_kv_heads=1), train=DEEP_TRAIN, snapshot_step=EQUAL_TRAINING,
               run="deep12-w8s8-1kv-shared", pair="deep12-full-equal"),
        _entry("deep12-full-equal", dict(compression=None, window=8, stride=8),
               backbone=dict(n_layers=12, n_kv_heads=1), train=DEEP_TRAIN, snapshot_step=EQUAL_TRAINING,
               run="deep12-full", pair="deep12-w8s8-1kv-shared-equal"),
        # Seed replicates of the deep equal-training pair (model and data seed 1, 2, 3).
        *_deep_seed_pair(1),
        *_deep_seed_pair(2),
        *_deep_seed_pair(3),
        # Stride 12 (the task's residue modulus 24 is a multiple of 12), and its full-attention twin.
        _entry("w12s12-4kv", dict(compression="gated", window=12, stride=12, gate="scalar"),
               backbone=dict(n_kv_heads=4)),
        _entry("w4s4-post", dict(compression="gated", window=4, stride=4, gate="scalar"), train=POST_TRAIN,
               init_from="w4s4"),
        _entry("full-s12", dict(compression=None, window=12, stride=12), backbone=dict(n_kv_heads=4)),
    ]
}


@dataclass(frozen=True)
class TextEntry:
    """A zoo model pretrained on natural text (a kept snapshot of one arm of
    `benchmarks/pretrain_python_code.py`), installed with its tokenizer (``tokenizer/``) and its
    evaluation task, `IdentifierRecall` on the run's held-out code (``metadata["task"]``)."""

    name: str
    description: str
    arm: str  # the run's folder under the benchmark's --root
    step: int  # the kept snapshot that ships

    @property
    def command(self) -> str:
        return command(self.name)


TEXT_ENTRIES: dict[str, TextEntry] = {name: TextEntry(name, MODELS[name], arm, 24000)
                                      for name, arm in (("py-w4s4", "w4s4-s0"), ("py-full", "full-s0"),
                                                        ("py-w8s8", "w8s8-s0"))}


def equal_training_step(curves_a, curves_b, min_mean: float = LEARNED_MEAN) -> int:
    """The equal-training snapshot of two runs: the first step at which BOTH have learned the task.

    ``curves_a``/``curves_b`` are runs' ``curves.csv`` frames (step, residue, phase, accuracy, n:
    the held-out probe); "learned" = the probe's mean accuracy over residues ``>= min_mean``."""
    min_mean = check_real("min_mean", min_mean, 0.0, 1.0, low_open=True, high_open=False,
                          why=" (a probe accuracy)")
    mean_a = curves_a.groupby("step").accuracy.mean()
    mean_b = curves_b.groupby("step").accuracy.mean()
    for step in sorted(set(mean_a.index) & set(mean_b.index)):
        if mean_a[step] >= min_mean and mean_b[step] >= min_mean:
            return int(step)
    raise UserInputError(f"no common step at which both runs reach a probe mean of {min_mean:.0%} "
                        f"(final: {mean_a.iloc[-1]:.3f} and {mean_b.iloc[-1]:.3f})")


def run_curves(name: str, run_dir: Union[str, Path, None] = None):
    """The held-out probe curves of ``name``'s training run: ``run_dir/curves.csv`` if given, else
    the shipped ``curves.csv`` of the run (or of the entry), else ``runs/zoo/<run>/curves.csv``."""
    e = entry(name)
    run = e.run or name
    if run_dir is not None:
        run_dir = check_read_path(run_dir, "a training run folder (curves.csv)", name="run_dir")
    candidates = ([Path(run_dir) / "curves.csv"] if run_dir is not None else []) + [
        CHECKPOINT_DIR / run / "curves.csv", CHECKPOINT_DIR / name / "curves.csv",
        Path("runs") / "zoo" / run / "curves.csv"]
    for path in candidates:
        if path.is_file():
            return pd.read_csv(path)
    raise MissingPathError(f"no training curves for {name!r} (looked in {', '.join(map(str, candidates))}); "
                            f"build the run with `phaseinterp zoo build {run}`")


def snapshot_step(name: str, run_dir: Union[str, Path, None] = None) -> int:
    """The step ``name`` ships: its fixed ``snapshot_step``, the final step, or (``EQUAL_TRAINING``)
    `equal_training_step` of its run's curves and its pair's."""
    e = entry(name)
    if e.snapshot_step == EQUAL_TRAINING:
        if e.pair is None:
            # internal: ZOO is the package's own table, so an entry without its pair is a bug here, not bad input
            raise ValueError(f"zoo entry {name!r} uses the equal-training rule but names no pair")
        return equal_training_step(run_curves(name, run_dir), run_curves(e.pair))
    return int(e.snapshot_step or e.train_config().steps)


def training_controls(name: str) -> dict[str, tuple[str, str]]:
    """The equal-training controls of a zoo model, as ``{"equal-step": (compressed, twin),
    "final-step": (compressed, twin)}`` zoo names (empty when ``name``'s run has no
    equal-training pair). For ``w4s4``: ``("w4s4-equal", "full")`` at the step of
    `equal_training_step` and ``("w4s4", "full-final")`` at the final step."""
    if name not in ENTRIES:
        return {}
    run = ENTRIES[name].run or name
    for e in ENTRIES.values():
        if e.snapshot_step == EQUAL_TRAINING and (e.run or e.name) == run and e.model_config(1).is_compressed:
            twin_run = ENTRIES[e.pair].run or e.pair
            final_twin = next((t.name for t in ENTRIES.values()
                               if (t.run or t.name) == twin_run and t.snapshot_step is None), None)
            final = next((c.name for c in ENTRIES.values() if (c.run or c.name) == run and c.snapshot_step is None),
                            None)
            out = {"equal-step": (e.name, e.pair)}
            if final and final_twin:
                out["final-step"] = (final, final_twin)
            return out
    return {}


def cycling_model_for(stride: int) -> Optional[str]:
    """The shipped zoo model on which gate cycling is meaningful at ``stride``: W = S, gated,
    non-uniform gates, payload shared across slots (`cycling_fitness`); the shallowest first.
    None when none ships."""
    stride = check_int("stride", stride, 1)
    shipped = set(available())
    fits = [e for e in ENTRIES.values()
            if e.name in shipped and e.compression.get("compression") == "gated"
            and e.compression.get("window") == e.compression.get("stride") == stride
            and e.compression.get("gate", "scalar") != "uniform" and e.compression.get("payload") == "shared"]
    fits.sort(key=lambda e: e.backbone.get("n_layers", BACKBONE["n_layers"]))
    return fits[0].name if fits else None


def entry(name: str) -> ZooEntry:
    if isinstance(name, str) and name in hf_zoo.RECIPES:
        raise UserInputError(f"zoo model {name!r} is a Hugging Face DeepSeek-V4 recipe (phaseinterp.zoo.deepseek_v4: "
                             f"`phaseinterp zoo build {name}`), not one of the own family's recipes "
                             f"({', '.join(ENTRIES)})")
    if isinstance(name, str) and name in TEXT_ENTRIES:
        raise UserInputError(f"zoo model {name!r} is pretrained on natural text, not by the zoo's recipe: rebuild it "
                             f"with `{TEXT_ENTRIES[name].command}`")
    check_name("name", name, list(ENTRIES), shown=f"unknown zoo model {name!r}", what="a recipe of the zoo",
               where="`phaseinterp zoo list` lists them")
    return ENTRIES[name]


def task_for(model):
    """The evaluation task stored with a zoo model."""
    return resolve_task(model)


def build(name: str, out_dir: Union[str, Path, None] = None, *, device=None, progress: bool = True,
          resume: bool = True, install: bool = True, threads: Optional[int] = 1) -> Path:
    """Train ``name`` with the zoo recipe and (``install=True``) copy its snapshot into the package.

    The run (checkpoints, snapshots, logs, curves) lives in ``out_dir`` (default
    ``runs/zoo/<name>``); rerunning resumes it. The shipped checkpoints were trained on CPU with
    ``threads=1``; other thread counts train an equivalent, not bit-identical, model.
    """
    if threads is not None:
        torch.set_num_threads(check_int("threads", threads, 1, why=" (or None: torch's default)"))

    e = entry(name)
    task = e.task_object()
    tc = e.train_config()
    run_dir = Path(out_dir) if out_dir is not None else Path("runs") / "zoo" / (e.run or name)
    init = None
    if e.init_from is not None:
        init = CHECKPOINT_DIR / e.init_from
        if not (init / "config.json").is_file():
            raise MissingPathError(f"{name!r} post-trains the shipped {e.init_from!r}, which is not in {init}; build it "
                                    f"with `phaseinterp zoo build {e.init_from}`")
    result = train(e.model_config(task.vocab.size), task, train_config=tc, device=device, out_dir=run_dir,
                   resume=resume, progress=progress, init_from=init,
                   metadata={"zoo_name": name, "command": e.command,
                             **({"init_from": e.init_from} if e.init_from else {})})
    step = snapshot_step(name, run_dir)
    source = run_dir / f"snapshot_{step:06d}"
    if not (source / "config.json").is_file():
        raise MissingPathError(f"snapshot {source} was not written; snapshot_steps must include {step}")
    if install:
        install_snapshot(name, source, result.curves, result.model.metadata)
    return source


def install_snapshot(name: str, source: Union[str, Path], curves, metadata: dict) -> Path:
    """Copy a run's snapshot into the package as zoo model ``name`` (atomically: a temporary folder
    renamed into place), with the run's ``metadata``, the shipped ``step`` and its probe ``curves``."""
    e = entry(name)
    source = Path(source)
    model = CompressedTransformer.from_pretrained(source)
    model.metadata.update(metadata)
    step = int(source.name.rsplit("_", 1)[-1])
    model.metadata.update({"step": step, "zoo_name": name, "description": e.description, "command": e.command})
    return _install(name, model, lambda tmp: atomic_write_text(tmp / "curves.csv", curves.to_csv(index=False)))


def _install(name: str, model: CompressedTransformer, add: Callable[[Path], Any]) -> Path:
    """Save ``model`` as zoo entry ``name`` in a temporary folder, ``add`` its other files there, then
    exchange it with the previous entry in one step (`move_into_place`)."""
    target = CHECKPOINT_DIR / name
    tmp = CHECKPOINT_DIR / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    add(tmp)
    move_into_place(tmp, target)
    return target


def install_text(name: str, run_dir: Union[str, Path], tokenizer: Union[str, Path]) -> Path:
    """Install natural-text zoo model ``name`` (`TEXT_ENTRIES`) from its pretraining run ``run_dir`` (the
    entry's kept ``step``) and the run's ``tokenizer`` folder: the weights, the tokenizer (``tokenizer/``)
    and the evaluation task, `IdentifierRecall` on the run's held-out split, in ``metadata["task"]``.
    Atomic, as `install_snapshot`."""
    check_name("name", name, list(TEXT_ENTRIES), what="a natural-text zoo model")
    e = TEXT_ENTRIES[name]
    run = check_read_path(run_dir, "a pretraining run folder", name="run_dir", expect="folder")
    tok_dir = check_read_path(tokenizer, "a tokenizer folder", name="tokenizer", expect="folder")
    tok = TextTokenizer(tok_dir)
    model = load_snapshot(run, e.step)
    manifest = json.loads((run / "data" / "manifest.json").read_text())
    if manifest.get("tokenizer_sha256") != tok.sha256:
        raise UserInputError(f"tokenizer={str(tokenizer)!r} is not the tokenizer run_dir={str(run_dir)!r} was trained "
                             "with (its sha256 differs from the run's token cache)")
    # 256-token prompts (the training length), the defaults
    task = IdentifierRecall.from_tokenizer(tok, TokenizedCorpus(run / "data", manifest).tokens("heldout"))
    model.metadata.update({"task": task.to_dict(), "task_type": "IdentifierRecall", "zoo_name": name,
                           "description": e.description, "command": e.command, "arm": e.arm})
    return _install(name, model, lambda tmp: shutil.copytree(tok_dir, tmp / "tokenizer"))


def recipe() -> dict[str, Any]:
    """The shared recipe, as recorded with every checkpoint."""
    return {"backbone": BACKBONE, "task": TASK, "train": json.loads(json.dumps(TRAIN, default=list))}


__all__ = ["ENTRIES", "EQUAL_TRAINING", "LEARNED_MEAN", "TEXT_ENTRIES", "TextEntry", "ZooEntry", "available", "build",
           "entry", "catalog", "cycling_model_for", "equal_training_step", "install_snapshot", "install_text", "load", "recipe", "run_curves", "snapshot_step", "task_for",
           "training_controls"]
