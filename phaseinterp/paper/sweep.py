"""The paper's controlled sweep as phaseinterp configs (`phaseinterp.paper.config`, `sweep`).

Every controlled run is the Qwen3-0.6B backbone (`preset("qwen3-0.6b")`) with one compression geometry
(W, S, KV heads, from ``runs()``) and at most one variant named in its id; `VARIANTS` maps variant ->
overrides (assumptions where the publication says no more):

- ``tied K/V`` (``kvshare``): ``tie_kv_gates``; ``uniform averaging`` (``meanpool``): ``gate="uniform"``;
- ``DeepSeek-style kernel``: ``compression="deepseek"``; ``uncompressed tail`` (``tail_concat``):
  ``memory="uncompressed_tail"``;
- ``seed`` 42 for every run but the replicates 43, 44 and 45; the rest (payload maps, exact band, RoPE
  base, vocabulary) is the preset's."""

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
