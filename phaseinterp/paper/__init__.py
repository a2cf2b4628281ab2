"""The paper's published numbers inside the toolkit (ByteDance Seed, "Periodic Weak Spots", 2026).

    import phaseinterp as pi
    pi.paper.runs()                                   # 31 rows: 23 controlled runs, 3 baselines, 5 DeepSeek
    pi.paper.profile("kvc_w8s8_1kv_baseline")         # a PhaseProfile, marked published (prefix padding)
    pi.paper.profile("DeepSeek-V4-Flash-Base")        # needle accuracy by residue mod 8, Wilson from counts
    pi.paper.knockout("kvc_w8s8_1kv_baseline")        # an AblationResult (head x residue map)
    pi.paper.gates("kvc_w8s8_1kv_baseline")           # gate profiles beside the folded knockouts
    pi.paper.cycling("kvc_w12s12_4kv")                # clean and shifted profiles, the toolkit's scores on them
    pi.paper.compare(pi.phase_profile(model), "kvc_w8s8_1kv_baseline")   # any profile beside a published run
    pi.paper.counterparts(model.cfg)                  # the published runs of a model's geometry, nearest first
    pi.paper.config("kvc_w8s8_1kv_nope")              # the run as a CompressedConfig (Qwen3-0.6B backbone)
    pi.paper.sweep()                                  # every controlled run -> its preset overrides, or why not

The numbers are the figure data of the paper's interactive post by its first author, shipped as
tidy CSV tables in ``phaseinterp/paper/data`` (written by ``python -m phaseinterp.paper.build`` from
``figdata.json``; `source()` says where they come from, with SHA-256). Nothing is downloaded.
Tables hold the published units (percent, pp); the toolkit's objects hold fractions, as every result.

Run names: the published ids (``kvc_w8s8_1kv_baseline``, ``full_attn_8kv``, ``flash_base``) or names
(``"W8/S8 · 1 KV · seed 42"``, ``"DeepSeek-V4-Flash-Base"``), case-insensitive. Paddings: ``"prefix"``
and ``"in-sequence"`` (controlled runs), ``"prefix"`` (baselines), ``"needle"`` (DeepSeek, one
evaluation; ``None`` picks a run's first).
"""

from phaseinterp.paper.compare import check_fold, compare, counterparts
from phaseinterp.paper.published import (
    TABLES,
    concentration,
    cycling,
    cycling_runs,
    evaluations,
    gates,
    knockout,
    profile,
    resolve,
    runs,
    source,
    table,
    trajectory,
)
from phaseinterp.paper.results import PaperComparison, PaperCycling, PaperGates
from phaseinterp.paper.sweep import VARIANTS, config, overrides, sweep

__all__ = ["TABLES", "VARIANTS", "PaperComparison", "PaperCycling", "PaperGates", "check_fold", "compare", "concentration",
           "config", "counterparts", "cycling", "cycling_runs", "evaluations", "gates", "knockout", "overrides", "profile", "resolve",
           "runs", "source", "sweep", "table", "trajectory"]
