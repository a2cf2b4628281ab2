"""Phase arithmetic: positions, residues, phases and compression windows (SCIENCE.md section 2).

Window ``j`` covers positions ``j*S .. j*S + W - 1``; it is *closed* (its entry exists)
once the sequence reaches its last token. A query at ``t`` sees entry ``j`` iff
``j*S + W - 1 <= t``.
"""

from __future__ import annotations


def _check_ws(window: int, stride: int) -> None:
    if stride < 1:
        raise ValueError(f"stride={stride} must be >= 1")
    if window < stride:
        raise ValueError(f"window={window} must be >= stride={stride}")


def phase(position: int, stride: int) -> int:
    """``position mod S``: the position relative to the compression-window boundaries."""
    if stride < 1:
        raise ValueError(f"stride={stride} must be >= 1")
    return position % stride


def residue(position: int, modulus: int) -> int:
    """``position mod R``, with R a multiple of the stride."""
    if modulus < 1:
        raise ValueError(f"modulus={modulus} must be >= 1")
    return position % modulus


def boundary_phase(stride: int) -> int:
    """S - 1: with non-overlapping windows the next token falls into the next entry."""
    if stride < 1:
        raise ValueError(f"stride={stride} must be >= 1")
    return stride - 1


def window_positions(j: int, window: int, stride: int) -> range:
    """Source positions covered by window ``j``."""
    _check_ws(window, stride)
    if j < 0:
        raise ValueError(f"window index j={j} must be >= 0")
    return range(j * stride, j * stride + window)


def n_closed_windows(length: int, window: int, stride: int) -> int:
    """Number of windows whose last token lies inside a prefix of ``length`` tokens."""
    _check_ws(window, stride)
    if length < window:
        return 0
    return (length - window) // stride + 1


def n_visible_entries(query_pos: int, window: int, stride: int) -> int:
    """Entries visible to a query at ``query_pos`` (those with ``jS + W - 1 <= t``)."""
    return n_closed_windows(query_pos + 1, window, stride)


def windows_containing(position: int, window: int, stride: int) -> list[tuple[int, int]]:
    """``(window j, slot i)`` pairs with ``j*S + i == position``; slot = offset inside the window."""
    _check_ws(window, stride)
    out = []
    for j in range(max(0, (position - window) // stride), position // stride + 1):
        i = position - j * stride
        if j >= 0 and 0 <= i < window:
            out.append((j, i))
    return out


def tail_start(query_pos: int, window: int, stride: int) -> int:
    """First position not covered by any window closed at ``query_pos`` (the "uncompressed tail")."""
    n = n_visible_entries(query_pos, window, stride)
    if n == 0:
        return 0
    return (n - 1) * stride + window
