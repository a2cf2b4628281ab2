"""This process's place in a data-parallel job (`phaseinterp.parallel`) and the collectives the ranks
use: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` from the launcher; NCCL with one GPU per rank when CUDA is
available, gloo on CPU; without a launcher, one process."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

import torch

from phaseinterp.errors import UserInputError


# ------------------------------------------------------------------ launcher
@dataclass(frozen=True)
class Launch:
    """This process's place in the job: ``rank`` of ``world_size``, ``local_rank`` on its machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise UserInputError(f"environment variable {name}={text!r} is not an integer") from None


def launch_info() -> Launch:
    """Rank, world size and local rank: from the process group when one is running, else from
    the launcher's environment (``torchrun`` and ``accelerate launch`` set ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``), else a single process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return Launch(torch.distributed.get_rank(), torch.distributed.get_world_size(), _env_int("LOCAL_RANK", 0))
    world = _env_int("WORLD_SIZE", 1)
    rank, local = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if world < 1 or not (0 <= rank < world):
        raise UserInputError(f"RANK={rank} is out of range for WORLD_SIZE={world} (0..{world - 1})")
    return Launch(rank, world, local)


def rank_device(launch: Optional[Launch] = None) -> torch.device:
    """``cuda:LOCAL_RANK`` when CUDA is available, else the CPU."""
    launch = launch or launch_info()
    if torch.cuda.is_available():
        return torch.device("cuda", launch.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(backend: Optional[str] = None) -> Launch:
    """Join the launcher's process group (once; a no-op for a single process or when already
    joined). ``backend`` defaults to ``"nccl"`` when CUDA is available, else ``"gloo"``."""
    launch = launch_info()
    if launch.world_size > 1 and not torch.distributed.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(rank_device(launch))
        torch.distributed.init_process_group(backend=backend)
    return launch


_OBJECT_GROUPS: dict = {}


def _object_group():
    """A gloo group for Python-object collectives (NCCL moves only CUDA tensors)."""
    if torch.distributed.get_backend() == "gloo":
        return None
    key = id(torch.distributed.distributed_c10d._get_default_group())
    if key not in _OBJECT_GROUPS:
        _OBJECT_GROUPS[key] = torch.distributed.new_group(backend="gloo")
    return _OBJECT_GROUPS[key]


def all_gather(obj: Any, launch: Launch) -> list:
    if launch.world_size == 1:
        return [obj]
    out: list = [None] * launch.world_size
    torch.distributed.all_gather_object(out, obj, group=_object_group())
    return out


def gather_to_main(obj: Any, launch: Launch) -> Optional[list]:
    if launch.world_size == 1:
        return [obj]
    out = [None] * launch.world_size if launch.is_main else None
    torch.distributed.gather_object(obj, out, dst=0, group=_object_group())
    return out


def raise_any(error: Optional[str], launch: Launch) -> None:
    """Every rank raises when any rank found an error (so none waits on a collective)."""
    errors = [e for e in all_gather(error, launch) if e]
    if errors:
        raise UserInputError(errors[0])  # the ranks check user input (the shard settings)
