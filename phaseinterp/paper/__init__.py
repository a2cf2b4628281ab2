"""The paper's published numbers inside the toolkit (ByteDance Seed, "Periodic Weak Spots", 2026).

    import phaseinterp as pi
    pi.paper.runs()                                   # 31 rows: 23 controlled runs, 3 baselines, 5 DeepSeek
    pi.paper.profile("kvc_w8s8_1kv_baseline")         # a PhaseProfile, marked published
    pi.paper.knockout("kvc_w8s8_1kv_baseline")        # an AblationResult (head x residue map)
    pi.paper.gates("kvc_w8s8_1kv_baseline")           # gate profiles beside the folded knockouts
    pi.paper.cycling("kvc_w12s12_4kv")                # clean and shifted profiles, the toolkit's scores on them
    pi.paper.compare(pi.phase_profile(model), "kvc_w8s8_1kv_baseline")   # any profile beside a published run
    pi.paper.counterparts(model.cfg)                  # the published runs of a model's geometry, nearest first
    pi.paper.config("kvc_w8s8_1kv_nope")              # the run as a CompressedConfig
    pi.paper.sweep()                                  # every controlled run -> its preset overrides, or why not

The numbers are the figure data of the paper's post, shipped as CSV tables in ``phaseinterp/paper/data``
(`source()`: provenance with SHA-256; nothing is downloaded); tables hold percent and pp, objects fractions.
Runs are named by published id or name, case-insensitive; paddings ``"prefix"``, ``"in-sequence"`` and
``"needle"`` (``None``: a run's first)."""

from phaseinterp.paper.compare import check_fold, compare, counterparts
from phaseinterp.paper.published import (TABLES, concentration, cycling, cycling_runs, evaluations, gates, knockout,
                                         profile, resolve, runs, source, table, trajectory)
from phaseinterp.paper.results import PaperComparison, PaperCycling, PaperGates
from phaseinterp.paper.sweep import VARIANTS, config, overrides, sweep

__all__ = ["TABLES", "VARIANTS", "PaperComparison", "PaperCycling", "PaperGates", "check_fold", "compare", "concentration",
           "config", "counterparts", "cycling", "cycling_runs", "evaluations", "gates", "knockout", "overrides", "profile", "resolve",
           "runs", "source", "sweep", "table", "trajectory"]
