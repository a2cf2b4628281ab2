"""Data-parallel experiments over prompts, under ``torchrun`` or ``accelerate launch``.

- `phaseinterp.parallel.launch`: the launcher's environment (`launch_info`, `rank_device`,
  `init_distributed`) and the collectives the runs use;
- `phaseinterp.parallel.shards`: the files of a sharded run (``DIR/run.json``,
  ``DIR/shards/chunk-NNNNNN.npz``), their identity checks, and `merge`;
- `phaseinterp.parallel.runs`: `sharded_profile`, `sharded_ablate`, `sharded_gate_cycling_profile`, each
  built from its single-process function by `sharded`.

``import phaseinterp`` loads this package on first use (``pi.parallel``).
"""

from phaseinterp.parallel.launch import Launch, init_distributed, launch_info, rank_device
from phaseinterp.parallel.runs import (
    sharded,
    sharded_ablate,
    sharded_gate_cycling_profile,
    sharded_profile,
)
from phaseinterp.parallel.shards import merge, model_fingerprint, shard_path

__all__ = ["Launch", "init_distributed", "launch_info", "merge", "model_fingerprint", "rank_device", "shard_path",
           "sharded", "sharded_ablate", "sharded_gate_cycling_profile", "sharded_profile"]
