"""Running `HookedDeepseekV4` on a model that accelerate offloads to CPU or disk (``device_map``).

accelerate keeps an offloaded module's weights on the ``meta`` device and loads them in a
hook around that module's own ``forward``. The wrapper calls the HF submodules but also reads
some parameters directly (``position_bias``, ``sinks``), so for each decoder layer it loads the
whole layer for the duration of the layer (`materialized`) and puts it back afterwards.
`check_max_memory` is the up-front check of ``max_memory`` (`phaseinterp.load_hf`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch
import torch.nn as nn

from phaseinterp._checks import parse_size
from phaseinterp.errors import UserInputError


def execution_device(module: nn.Module) -> torch.device:
    """Where ``module`` computes: accelerate's execution device when a hook places it, else
    the device of its first parameter that is not on ``meta``."""
    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    for tensor in list(module.parameters()) + list(module.buffers()):
        if tensor.device.type != "meta":
            return tensor.device
    raise UserInputError(f"{type(module).__name__}: every weight is on the meta device and no accelerate hook "
                        "says where it runs (an offloaded model must be loaded with device_map)")


def is_offloaded(module: nn.Module) -> bool:
    """Whether any weight of ``module`` lives off-device (accelerate's ``meta`` placeholder)."""
    return any(p.device.type == "meta" for p in module.parameters())


@contextmanager
def materialized(module: nn.Module) -> Iterator[nn.Module]:
    """Load every offloaded weight of ``module`` onto its execution device for the body, then
    offload them again (also when the body raises). A no-op for a module that is in memory."""
    hooked = [m for m in module.modules() if getattr(getattr(m, "_hf_hook", None), "offload", False)]
    loaded = []
    try:
        for m in hooked:
            m._hf_hook.pre_forward(m)
            loaded.append(m)
        yield module
    finally:
        for m in reversed(loaded):
            m._hf_hook.post_forward(m, None)


def _device_budgets(max_memory: dict) -> dict[Any, int]:
    if not isinstance(max_memory, dict) or not max_memory:
        raise UserInputError(f"max_memory={max_memory!r} must be a non-empty dict of device -> size "
                            "(e.g. {0: '70GiB', 'cpu': '200GiB'})")
    budgets = {}
    for device, size in max_memory.items():
        valid = (isinstance(device, int) and not isinstance(device, bool) and device >= 0) or device in ("cpu", "disk", "mps") \
            or (isinstance(device, str) and (device.startswith("cuda:") or device.startswith("xpu:")))
        if not valid:
            raise UserInputError(f"max_memory key {device!r} is not a device (valid: GPU indices 0, 1, ..., 'cpu', 'disk')")
        budgets[device] = parse_size(size, f"max_memory[{device!r}]")
    return budgets


def check_max_memory(max_memory: Optional[dict], device_map: Any, offload_folder: Optional[str],
                     layer_bytes: dict[str, int], total_bytes: int) -> None:
    """Refuse, before loading, a ``max_memory`` that cannot work.

    ``layer_bytes``: bytes of each unit accelerate will not split (the decoder layers, at the
    load dtype). Errors: ``max_memory`` without a ``device_map``; a budget on every device
    smaller than the largest layer (nothing can run: an offloaded layer is loaded whole onto its
    execution device); a model that does not fit the budgets when no ``offload_folder`` is given.
    """
    if max_memory is None:
        return
    budgets = _device_budgets(max_memory)
    if device_map is None:
        raise UserInputError(f"max_memory={max_memory!r} needs device_map (e.g. device_map='auto'); without one the "
                            "whole model is loaded on one device")
    name, largest = max(layer_bytes.items(), key=lambda kv: kv[1])
    on_device = {d: b for d, b in budgets.items() if d != "disk"}
    if not on_device or max(on_device.values()) < largest:
        raise UserInputError(f"max_memory={max_memory!r} is too small for anything: the largest decoder layer "
                            f"({name}) needs {largest:,} bytes on one device to run, and no device gets that much "
                            f"(give some device at least {largest:,} bytes)")
    if sum(on_device.values()) < total_bytes and offload_folder is None:
        raise UserInputError(f"max_memory={max_memory!r} holds {sum(on_device.values()):,} of the model's "
                            f"{total_bytes:,} bytes: pass offload_folder= (a directory for the layers that go to disk) "
                            "or raise max_memory")
