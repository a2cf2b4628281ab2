"""Disjoint evaluation / calibration / training data: one seed stream per split, one parity rule.

A mapping belongs to a split by its **parity**: the sum over its records of a fixed pseudo-random bit
per (key, value) pair, mod 2 (0: evaluation, 1: calibration), so the splits never share a mapping.
The bit is `pair_bit_table` (a seeded table, `KeyValueRetrieval`) or `hashed_pair_bits` (a splitmix64
hash of the codes, `NeedleRetrieval`); both are frozen: they define the shipped evaluation sets."""

from functools import lru_cache

import numpy as np
from jaxtyping import Int

from phaseinterp._checks import check_seed

# Seed-space separation: each split draws from its own SeedSequence spawn key.
SPLIT_CODES = {"eval": 0, "calibration": 1, "train": 2}
# The parity each split's mappings must have (training data is not constrained).
SPLIT_PARITY = {"eval": 0, "calibration": 1}
PAIR_BITS_SEED = 20260101  # fixes the table, never the caller's seed


def split_rng(seed: int, split: str, *extra: int) -> np.random.Generator:
    """The random stream of ``split`` (and optional sub-streams ``extra``, e.g. a residue group)."""
    check_seed("seed", seed)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(SPLIT_CODES[split], *extra)))


@lru_cache(maxsize=8)
def pair_bit_table(n_keys: int, n_values: int) -> np.ndarray:
    """Bit of each (key index, value index) pair: a fixed random table."""
    table = np.random.default_rng(PAIR_BITS_SEED).integers(0, 2, size=(n_keys, n_values))
    table.setflags(write=False)
    return table


def hashed_pair_bits(key_codes: np.ndarray, value_codes: np.ndarray) -> np.ndarray:
    """Bit of each (key code, value code) pair: the top bit of a splitmix64 finalizer."""
    x = key_codes.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + value_codes.astype(np.uint64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(63)).astype(np.int64)


def mapping_parity(pair_bits: Int[np.ndarray, "*batch record"]) -> Int[np.ndarray, "*batch"]:
    """The split bit of each mapping from its records' pair bits: 0 = evaluation, 1 = calibration."""
    return np.asarray(pair_bits.sum(axis=-1) % 2)


def mapping_split(
    keys: Int[np.ndarray, "*batch record"], values: Int[np.ndarray, "*batch record"], n_keys: int, n_values: int
) -> Int[np.ndarray, "*batch"]:
    """Parity bit of each mapping (key/value *indices* of its records): 0 = evaluation, 1 = calibration."""
    return mapping_parity(pair_bit_table(n_keys, n_values)[keys, values])


def draw_mappings(
    count: int, n_records: int, n_keys: int, n_values: int, split: str, rng: np.random.Generator
) -> tuple[Int[np.ndarray, "{count} {n_records}"], Int[np.ndarray, "{count} {n_records}"]]:
    """``count`` random injective mappings (key index, value index) with the split's parity bit."""
    keys = np.argsort(rng.random((count, n_keys)), axis=1)[:, :n_records]
    values = np.argsort(rng.random((count, n_values)), axis=1)[:, :n_records]
    if split not in SPLIT_PARITY:
        return keys, values
    while True:
        bad = np.flatnonzero(mapping_split(keys, values, n_keys, n_values) != SPLIT_PARITY[split])
        if len(bad) == 0:
            return keys, values
        keys[bad] = np.argsort(rng.random((len(bad), n_keys)), axis=1)[:, :n_records]
        values[bad] = np.argsort(rng.random((len(bad), n_values)), axis=1)[:, :n_records]

