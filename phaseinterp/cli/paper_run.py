"""``phaseinterp pretrain --paper-run RUN``: a published controlled run's architecture (`phaseinterp.paper.config`)."""

from __future__ import annotations

from typing import Any, Optional

from phaseinterp.cli.args import UsageError

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
    from phaseinterp import paper

    overrides = paper.overrides(run)  # UserInputError naming the run: unknown, DeepSeek model, inexpressible variant
    seed = overrides.pop("seed")
    return paper.resolve(run), overrides, {"seed": seed}
