"""``phaseinterp pretrain --paper-run RUN``: a published controlled run's architecture (`phaseinterp.paper.config`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

from phaseinterp import paper
from phaseinterp.cli.args import UsageError

RUN_FILE = "pretrain.json"  # phaseinterp.train.pretrain.RUN_FILE (not imported here: torch loads lazily)

BACKBONE = "qwen3-0.6b"  # phaseinterp.paper.sweep.BACKBONE (not imported here: the paper tables load lazily)


def paper_run_settings(args, file: dict) -> tuple[Optional[str], Optional[dict[str, Any]], dict[str, Any]]:
    """``(run id, model overrides of preset BACKBONE, train defaults)`` for ``--paper-run`` (``(None, None, {})``
    without it). Refuses ``--paper-run`` beside ``--preset``, ``--set`` or a ``--config`` with a "model" entry
    (each names the architecture), and a command with neither ``--paper-run`` nor ``--preset``."""
    run = getattr(args, "paper_run", None)
    if run is None:
        if getattr(args, "preset", None) is None:
            raise UsageError("pretrain needs --preset NAME or --paper-run RUN (the architecture)")
        return None, None, {}
    for flag, given in (("--preset", args.preset is not None), ("--set", bool(args.overrides)),
                        ("--config (its \"model\" entry)", "model" in file)):
        if given:
            raise UsageError(f"--paper-run and {flag} both name the architecture; --paper-run {run} is the "
                             f"published run's own (phaseinterp.paper.config), so drop {flag.split()[0]} (a --config "
                             "with only a \"train\" entry is fine)")
    overrides = paper.overrides(run)  # UserInputError naming the run: unknown, DeepSeek model, inexpressible variant
    seed = overrides.pop("seed")
    return paper.resolve(run), overrides, {"seed": seed}


def default_paper_run(args) -> Optional[str]:
    """``profile RUN_DIR`` of a run pretrained with ``--paper-run``: ``--paper`` defaults to the published run
    its ``pretrain.json`` records (``paper_run``), so the profile is printed beside the published one
    (`phaseinterp.paper.compare`). Sets ``args.paper`` and returns the run, or None (nothing recorded,
    ``--paper`` given, a served model)."""
    model = getattr(args, "model", None)
    if getattr(args, "paper", None) is not None or getattr(args, "engine", None) is not None or model is None:
        return None
    record = Path(str(model)) / RUN_FILE
    try:
        run = json.loads(record.read_text()).get("paper_run") if record.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(run, str):
        return None
    args.paper = run
    print(f"phaseinterp: --paper {run}: {model} was pretrained as the published run {run} ({RUN_FILE}); its "
          "profile is printed beside the published one", file=sys.stderr)
    return run
