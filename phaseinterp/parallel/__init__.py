"""Data-parallel experiments over prompts, under ``torchrun`` or ``accelerate launch``.

- `phaseinterp.parallel.launch`: the launcher's environment (`launch_info`, `rank_device`,
  `init_distributed`) and the collectives the runs use;
- `phaseinterp.parallel.shards`: the files of a sharded run (``DIR/run.json``,
  ``DIR/shards/chunk-NNNNNN.npz``), their identity checks, and `merge`;
- `phaseinterp.parallel.runs`: `sharded_profile`, `sharded_ablate`, `sharded_gate_cycling`.

The public names are importable from here (``phaseinterp.parallel.sharded_ablate``), on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = ({name: "phaseinterp.parallel.runs" for name in ("sharded_profile", "sharded_ablate", "sharded_gate_cycling")}
          | {name: "phaseinterp.parallel.launch" for name in ("Launch", "launch_info", "rank_device",
                                                              "init_distributed")}
          | {name: "phaseinterp.parallel.shards" for name in ("merge", "shard_path", "model_fingerprint")})


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'phaseinterp.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(_NAMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))


__all__ = sorted(_NAMES)
