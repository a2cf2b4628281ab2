"""Input checks shared by the experiments and the CLI: each raises a ValueError naming the
value and the valid range, before any expensive work."""

from __future__ import annotations

import re

from typing import Any, Union

from phaseinterp.errors import UserInputError

MAX_PROMPTS = 500_000  # per call: n_per_residue * R; more would allocate gigabytes of prompts on a laptop



def check_int(name: str, value: Any, low: int = 1, high: int | None = None) -> int:
    """``value`` as an int if it is an integer in ``low..high``; else a ValueError naming it."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UserInputError(f"{name}={value!r} must be an integer >= {low}")
    value = int(value)
    if value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in {low}..{high}"
        raise UserInputError(f"{name}={value} is out of range (must be {span})")
    return value


def check_n_per_residue(value: Any, modulus: int | None = None, name: str = "n_per_residue") -> int:
    """An integer >= 1 whose prompt count ``value * modulus`` stays within `MAX_PROMPTS`."""
    value = check_int(name, value, 1)
    modulus = modulus or 1
    limit = MAX_PROMPTS // modulus
    if value > limit:
        raise UserInputError(
            f"{name}={value} asks for {value * modulus:,} prompts ({modulus} residues); at most "
            f"{MAX_PROMPTS:,} prompts per call are allowed ({name} <= {limit:,} for R={modulus})"
        )
    return value


def check_device(device: Any):
    """A ``torch.device`` that exists on this machine; None stays None (the model's own device)."""
    if device is None:
        return None
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise UserInputError(f"device={device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:0', 'mps')") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserInputError(f"device={device!r}: CUDA is not available on this machine (use 'cpu')")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            n = torch.cuda.device_count()
            raise UserInputError(f"device={device!r}: this machine has {n} CUDA device(s) (cuda:0..cuda:{n - 1})")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UserInputError(f"device={device!r}: MPS is not available on this machine (use 'cpu')")
    return dev


def parse_size(value: Union[int, str], what: str = "size") -> int:
    """Bytes from ``1000``, ``"256KB"``, ``"10MiB"``, ``"2GB"`` (KB = 10^3, KiB = 2^10); a UserInputError otherwise."""
    if isinstance(value, bool):
        raise UserInputError(f"{what}={value!r} is not a size (bytes as an int, or e.g. '256KB', '10MiB')")
    if isinstance(value, int):
        n = value
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(value), flags=re.IGNORECASE)
        if match is None:
            raise UserInputError(f"{what}={value!r} is not a size (bytes as an int, or e.g. '256KB', '10MiB', '80GB')")
        number, unit = float(match.group(1)), (match.group(2) or "B").upper()
        power = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit[0]]
        n = int(number * ((1024 if "I" in unit else 1000) ** power))
    if n <= 0:
        raise UserInputError(f"{what}={value!r} must be a positive number of bytes")
    return n
