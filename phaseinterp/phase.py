"""Phase arithmetic: compression windows, their closing times and boundaries (docs/science.md section 2).

Window ``j`` of a grid with offset ``o`` covers positions ``j*S + o .. j*S + o + W - 1``
(``o = 0`` on the paper's shared grid; per-KV-head offsets stagger the grids). It is
*closed* (its entry exists) once the sequence reaches its last token: a query at ``t``
sees entry ``j`` iff ``j*S + o + W - 1 <= t``. The counting functions accept ints or
integer tensors (broadcast against each other), so the attention masks use them too.
"""

from __future__ import annotations

from typing import Any

from phaseinterp._checks import check_int
from phaseinterp.errors import UserInputError


def _check_ws(window: int, stride: int) -> None:
    if stride < 1:
        raise UserInputError(f"stride={stride} must be >= 1")
    if window < stride:
        raise UserInputError(f"window={window} must be >= stride={stride}")


def _at_least_zero(x: Any) -> Any:
    return x.clamp(min=0) if hasattr(x, "clamp") else max(x, 0)


def check_residue_modulus(modulus: int, stride: int) -> None:
    """Residues mod ``modulus`` fold to phases mod ``stride`` only when S divides R."""
    check_int("stride", stride, 1)
    if modulus % stride:
        divisors = [d for d in range(1, modulus + 1) if modulus % d == 0]
        raise UserInputError(
            f"cannot fold R={modulus} residues to stride={stride} phases (valid strides: {divisors}): the "
            f"residue modulus R={modulus} is not a multiple of stride={stride}"
        )


def boundary_phase(stride: int, offset: int = 0) -> int:
    """The phase ``t mod S`` of a grid's window-closing positions: S - 1 on the shared grid.

    With non-overlapping windows the next token falls into the next entry."""
    if stride < 1:
        raise UserInputError(f"stride={stride} must be >= 1")
    if not (0 <= offset < stride):
        raise UserInputError(f"offset={offset} is out of range 0..{stride - 1}")
    return (offset + stride - 1) % stride


def window_positions(j: int, window: int, stride: int, offset: int = 0) -> range:
    """Source positions covered by window ``j``."""
    _check_ws(window, stride)
    if j < 0:
        raise UserInputError(f"window index j={j} must be >= 0")
    return range(j * stride + offset, j * stride + offset + window)


def n_closed_windows(length, window: int, stride: int, offset=0):
    """Number of windows whose last token lies inside a prefix of ``length`` tokens."""
    _check_ws(window, stride)
    return _at_least_zero((length - offset - window) // stride + 1)


def n_visible_entries(query_pos, window: int, stride: int, offset=0):
    """Entries visible to a query at ``query_pos`` (those with ``jS + o + W - 1 <= t``)."""
    return n_closed_windows(query_pos + 1, window, stride, offset)


def tail_start(query_pos, window: int, stride: int, offset=0):
    """First position after the last window closed at ``query_pos`` (the "uncompressed tail"
    starts there; 0 before any window closes)."""
    n = n_visible_entries(query_pos, window, stride, offset)
    return (n > 0) * ((n - 1) * stride + offset + window)
