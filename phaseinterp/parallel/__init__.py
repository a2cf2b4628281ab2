"""Data-parallel experiments over prompts, under ``torchrun`` or ``accelerate launch``: `launch` (the
launcher's environment, collectives), `shards` (``DIR/run.json``, ``DIR/shards/chunk-NNNNNN.npz``,
`merge`) and `runs` (`sharded_profile`, `sharded_ablate`, `sharded_gate_cycling_profile`)."""

from phaseinterp.parallel.launch import Launch, init_distributed, launch_info, rank_device
from phaseinterp.parallel.runs import sharded, sharded_ablate, sharded_gate_cycling_profile, sharded_profile
from phaseinterp.parallel.shards import merge, model_fingerprint, shard_path

__all__ = ["Launch", "init_distributed", "launch_info", "merge", "model_fingerprint", "rank_device", "shard_path",
           "sharded", "sharded_ablate", "sharded_gate_cycling_profile", "sharded_profile"]
