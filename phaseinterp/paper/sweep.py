"""The paper's controlled sweep as phaseinterp configs (`phaseinterp.paper.config`, `sweep`).

Every controlled run of the paper is the Qwen3-0.6B backbone (`preset("qwen3-0.6b")`: 28 layers,
d_model 1024, 16 query heads of 128) with one compression geometry (window W, stride S, KV heads per
layer, from ``runs()``) and at most one variant, named in the run's id and name. ``figdata.json``
states the variant only there (and, for the 9 runs with gate profiles, the gate ``mode`` and whether K
and V share one gate, ``tied``); the variant -> override table is `VARIANTS`, checked in the tests
against those names and the gate table.

Reading of the names (assumptions where the publication says no more):

- ``tied K/V`` (``kvshare``): one gate shared by the K and V branches (``tie_kv_gates``; the
  "tied key/value gates" variant of docs/science.md).
- ``uniform averaging`` (``meanpool``): ``gate="uniform"`` (alpha = 1/W, no gate parameters).
- ``DeepSeek-style kernel``: ``compression="deepseek"`` (vector gates, one entry as key and value;
  W8/S4 is its two-half layout W = 2S).
- ``uncompressed tail`` (``tail_concat``): ``memory="uncompressed_tail"``.
- Seeds: ``seed`` 42 (the baseline, "seed 42") for every run but the replicates 43, 44 and 45.
- Not published, so the preset's: the payload maps (shared), the exact band (16 tokens), RoPE base
  (1e6), vocabulary (Qwen3's; a tokenizer given to ``pretrain`` sets its own).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from phaseinterp.config import CompressedConfig, preset
from phaseinterp.errors import UserInputError
from phaseinterp.paper.published import _run_row, table

BACKBONE = "qwen3-0.6b"  # the controlled runs' backbone (Qwen3-0.6B shape, 28 layers)
DEFAULT_SEED = 42

# run id -> (variant label, overrides beyond W, S and KV heads) ; a str instead of a dict: the refusal reason
VARIANTS: dict[str, tuple[str, Any]] = {
    "kvc_w8s8_1kv_baseline": ("baseline", {}),
    "kvc_w8s8_1kv_baseline_seed43": ("baseline, seed 43", {"seed": 43}),
    "kvc_w8s8_1kv_baseline_seed44": ("baseline, seed 44", {"seed": 44}),
    "kvc_w8s8_1kv_baseline_seed45": ("baseline, seed 45", {"seed": 45}),
    "kvc_w4s4_1kv": ("geometry", {}),
    "kvc_w8s4": ("geometry", {}),
    "kvc_w8s6": ("geometry", {}),
    "kvc_w12s12_1kv": ("geometry", {}),
    "kvc_w8s8_2kv": ("KV heads", {}),
    "kvc_w8s8_4kv": ("KV heads", {}),
    "kvc_w8s8_8kv": ("KV heads", {}),
    "kvc_w8s8_1kv_kvshare": ("tied K/V", {"tie_kv_gates": True}),
    "kvc_w8s8_1kv_meanpool": ("uniform averaging", {"gate": "uniform"}),
    "kvc_w8s8_1kv_mean_kvshare_postnorm": (
        "uniform averaging + tied K/V + post-norm",
        "post-norm: phaseinterp's gated kernel has no normalisation after compression (only the deepseek kernel "
        "RMS-normalises its entry, and that kernel has vector gates, not uniform averaging), and with uniform "
        "averaging there is no gate to tie, so the run's shared K/V entry is not expressible either"),
    "kvc_w8s8_1kv_vector": ("vector gates", {"gate": "vector"}),
    "kvc_w8s8_1kv_noQKnorm": ("no Q/K norm", {"qk_norm": False}),
    "kvc_w8s8_1kv_nobias": ("no gate bias", {"gate_bias": False}),
    "kvc_w8s8_1kv_nope": ("no RoPE", {"positional": "none"}),
    "kvc_w8s8_1kv_rope16": ("RoPE on 16 dims", {"rope_dims": 16}),
    "kvc_w8s8_1kv_tail_concat": ("uncompressed tail", {"memory": "uncompressed_tail"}),
    "kvc_w8s8_8kv_tail_concat": ("uncompressed tail", {"memory": "uncompressed_tail"}),
    "kvc_w8s4_dsv4kernel_1kv_rope16": ("DeepSeek-style kernel, RoPE on 16 dims",
                                       {"compression": "deepseek", "gate": "vector", "rope_dims": 16}),
    "kvc_w8s4_dsv4kernel_1kv_scalar_rope16": (
        "DeepSeek-style kernel with scalar gates, RoPE on 16 dims",
        "scalar gates on the DeepSeek kernel: phaseinterp's deepseek kernel always has per-channel ('vector') "
        "gates (CompressedConfig refuses compression='deepseek' with gate='scalar')"),
    "full_attn_1kv": ("full attention", {"compression": None}),
    "full_attn_4kv": ("full attention", {"compression": None}),
    "full_attn_8kv": ("full attention", {"compression": None}),
}


def overrides(run: str) -> dict[str, Any]:
    """The `preset("qwen3-0.6b", **overrides)` fields of published run ``run`` (W, S, KV heads, seed and its
    variant); a run whose variant phaseinterp cannot express, or a DeepSeek model, is refused by name."""
    row = _run_row(run)
    rid = str(row.id)
    if row.kind == "DeepSeek":
        raise UserInputError(f"run={run!r} is the DeepSeek model {row['name']} ({rid}), a released model measured by "
                             "the paper, not a controlled pretraining run: phaseinterp has no config for it (its "
                             "published profile: phaseinterp.paper.profile); valid: the 23 controlled runs and 3 "
                             "full-attention baselines of phaseinterp.paper.sweep()")
    label, extra = VARIANTS[rid]
    if isinstance(extra, str):
        raise UserInputError(f"run={run!r} ({rid}, {row['name']}): its variant '{label}' cannot be expressed in "
                             f"phaseinterp: {extra}")
    out: dict[str, Any] = {"n_kv_heads": int(row.kv_heads), "seed": DEFAULT_SEED}
    if row.kind == "controlled":
        out.update(window=int(row.W), stride=int(row.S))
    out.update(extra)
    return out


def config(run: str) -> CompressedConfig:
    """Published run ``run`` (an id or a name of `runs()`) as a `CompressedConfig` at the paper's geometry:
    `preset("qwen3-0.6b")` with the run's window, stride, KV heads, seed and variant (`VARIANTS`); the
    full-attention baselines with ``compression=None``. Refused by name: a variant phaseinterp cannot
    express (uniform averaging + tied K/V + post-norm; the DeepSeek kernel with scalar gates), the
    DeepSeek models, and an unknown run (listing the valid ones)."""
    cfg = preset(BACKBONE, **overrides(run))
    if cfg.n_layers != int(_run_row(run).layers):  # the backbone and the publication agree (28 layers)
        raise UserInputError(f"run={run!r} has {int(_run_row(run).layers)} layers; the {BACKBONE} preset has "
                             f"{cfg.n_layers}")
    return cfg


def sweep() -> pd.DataFrame:
    """One row per controlled run and full-attention baseline (26): ``id``, ``name``, ``kind``, ``W``,
    ``S``, ``kv_heads``, ``variant``, ``overrides`` (the `preset("qwen3-0.6b", ...)` fields, as text;
    empty when refused), ``expressible`` and ``refusal`` (why not)."""
    rows = []
    for _, row in table("runs").iterrows():
        if row.kind == "DeepSeek":
            continue
        label, extra = VARIANTS[row.id]
        refused = isinstance(extra, str)
        shown = "" if refused else ", ".join(f"{k}={v!r}" for k, v in overrides(row.id).items())
        rows.append(dict(id=row.id, name=row["name"], kind=row.kind, W=row.W, S=row.S, kv_heads=row.kv_heads,
                         variant=label, overrides=shown, expressible=not refused, refusal=extra if refused else ""))
    out = pd.DataFrame(rows)
    for column in ("W", "S", "kv_heads"):
        out[column] = out[column].astype("Int64")
    return out
