"""Prompt layout shared by the retrieval tasks: ``head + (gap, record)* + gap + tail``, records separated
by filler runs (`feasible_index_range`, `filler_gaps`, `lay_out`)."""

import numpy as np
from jaxtyping import Int

from phaseinterp.errors import UserInputError

PADDINGS = ("prefix", "in_sequence")


def check_padding(padding: str) -> None:
    if padding not in PADDINGS:
        raise UserInputError(f"padding={padding!r} is not one of {PADDINGS}")


def feasible_index_range(
    p: Int[np.ndarray, " batch"], start: int, record_len: int, slack: int, n_records: int
) -> tuple[Int[np.ndarray, " batch"], Int[np.ndarray, " batch"]]:
    """Record indices i that put a record's first token at p: ``G = p - start - L i`` in 0..slack."""
    low = np.maximum(0, -((slack - (p - start)) // record_len))  # ceil((p - start - slack) / L)
    high = np.minimum(n_records - 1, (p - start) // record_len)
    return low, high



def filler_gaps(
    target_index: Int[np.ndarray, " batch"],
    before: Int[np.ndarray, " batch"],
    slack: int,
    n_records: int,
    padding: str,
    rng: np.random.Generator,
) -> Int[np.ndarray, "batch gap"]:
    """Filler counts in the ``n_records + 1`` gaps (before record 0, ..., after the last record).

    ``before`` fillers go before the target record, the rest after it. ``prefix``: all of
    them in one run at the start and one run after the records, so the records stay
    contiguous and move together. ``in_sequence``: each filler drops into a uniformly random
    gap on its side of the target, so distractors move independently of the target.
    """
    batch = len(target_index)
    gaps = np.zeros((batch, n_records + 1), dtype=np.int64)
    rows = np.arange(batch)
    if padding == "prefix":
        gaps[rows, 0] = before
        gaps[rows, n_records] += slack - before
        return gaps
    if slack == 0:
        return gaps
    u = rng.random((batch, slack))
    k = np.arange(slack)[None, :]
    i = target_index[:, None]
    left = np.minimum((u * (i + 1)).astype(np.int64), i)
    right = np.minimum(i + 1 + (u * (n_records - i)).astype(np.int64), n_records)
    part = np.where(k < before[:, None], left, right)
    np.add.at(gaps, (np.repeat(rows, slack), part.ravel()), 1)
    return gaps



def lay_out(
    records: Int[np.ndarray, "batch record token"],
    gaps: Int[np.ndarray, "batch gap"],
    tail: Int[np.ndarray, "batch tail"],
    seq_len: int,
    head: Int[np.ndarray, " head"],
    filler_ids: Int[np.ndarray, " filler"],
    rng: np.random.Generator,
) -> tuple[Int[np.ndarray, "batch {seq_len}"], Int[np.ndarray, "batch record"]]:
    """Tokens ``head + (gap, record)* + gap + tail``; returns tokens and each record's first position."""
    batch, n_records, record_len = records.shape
    tokens = rng.choice(filler_ids, size=(batch, seq_len))
    tokens[:, : len(head)] = head
    starts = len(head) + np.cumsum(gaps[:, :n_records], axis=1) + record_len * np.arange(n_records)
    rows = np.arange(batch)[:, None]
    for offset in range(record_len):
        tokens[rows, starts + offset] = records[:, :, offset]
    tokens[:, seq_len - tail.shape[1] :] = tail
    return tokens, starts



def residue_cycle_positions(n: int, lo: int, hi: int, modulus: int, rng: np.random.Generator) -> Int[np.ndarray, " n"]:
    """``n`` positions in ``lo..hi`` whose residues cycle ``0..R-1``, uniform within each residue
    (calibration prompts: no moment matching)."""
    residues = np.arange(n) % modulus
    firsts = lo + (residues - lo) % modulus
    return firsts + modulus * (rng.random(n) * ((hi - firsts) // modulus + 1)).astype(np.int64)
