"""Long-context needle retrieval: thousands of multi-token key-value records, target near the middle."""

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from phaseinterp.errors import UserInputError
from phaseinterp.phase import check_residue_modulus
from phaseinterp.tasks._serialize import TaskSettings
from phaseinterp.tasks.batches import (TaskBatch, final_position_batch, joined_residue_groups, observed_moments,
                                       residue_groups)
from phaseinterp._checks import check_int
from phaseinterp.tasks.layout import check_padding, feasible_index_range, filler_gaps, lay_out
from phaseinterp.tasks.layout import residue_cycle_positions
from phaseinterp.tasks.placement import TargetPlacement, check_target_band, match_target_moments
from phaseinterp.tasks.splits import SPLIT_PARITY, hashed_pair_bits, mapping_parity, split_rng
from phaseinterp.tasks.vocab import Tokenizer, Vocab
from phaseinterp.tasks.length_axis import LengthPadding


def encode_piece(tokenizer: Any, text: str) -> list[int]:
    """Ids without special tokens (HF tokenizers add BOS/EOS unless told not to)."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return list(tokenizer.encode(text))


@dataclass(frozen=True)
class TokenPools:
    """Token ids a needle prompt is built from."""

    key_ids: tuple[int, ...]
    value_ids: tuple[int, ...]
    filler_ids: tuple[int, ...]
    head: tuple[int, ...]  # e.g. (<bos>,)
    separator: tuple[int, ...]  # between the records and the demonstrations

    @classmethod
    def from_vocab(cls, vocab: Vocab) -> "TokenPools":
        return cls(vocab.key_ids, vocab.value_ids, vocab.filler_ids, (vocab.bos_id,), (vocab.sep_id,))

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Tokenizer,
        key_pieces: tuple[str, ...],
        value_pieces: tuple[str, ...],
        filler_pieces: tuple[str, ...],
        separator: str,
    ) -> "TokenPools":
        """Pieces that encode to exactly one token become the pools; the rest are dropped."""

        def single(pieces: tuple[str, ...], name: str) -> tuple[int, ...]:
            ids = [encode_piece(tokenizer, p) for p in pieces]
            kept = tuple(dict.fromkeys(i[0] for i in ids if len(i) == 1))
            if len(kept) < 2:
                raise UserInputError(
                    f"only {len(kept)} of the {len(pieces)} {name} encode to a single token with this tokenizer; "
                    "pass pieces that do (e.g. words with a leading space)"
                )
            return kept

        keys, values = single(key_pieces, "key_pieces"), single(value_pieces, "value_pieces")
        fillers = single(filler_pieces, "filler_pieces")
        overlap = set(keys) & set(values)
        if overlap:
            raise UserInputError(f"key and value pieces share token ids {sorted(overlap)}")
        sep = tuple(encode_piece(tokenizer, separator))
        if not sep:
            raise UserInputError(f"separator={separator!r} encodes to no tokens")
        bos = getattr(tokenizer, "bos_token_id", None)
        return cls(keys, values, fillers, () if bos is None else (int(bos),), sep)


@dataclass(frozen=True, repr=False)
class NeedleRetrieval(TaskSettings):
    """Needle-in-a-haystack retrieval with multi-token records (DeepSeek style).

    Prompt: ``[head] (fillers, record)* fillers [separator] demo-records target-key``; a record is
    ``key_tokens`` key tokens then ``value_tokens`` value tokens, keys distinct. The target key ends
    the prompt at ``T - 1``; ``answer`` is the *first* value token (top-1 at ``T - 1``), the whole value
    is in ``answer_tokens``. The target position is moment-matched per residue group as in
    :class:`KeyValueRetrieval`, inside a ``target_window`` band centred on the prompt's middle.
    ``n_records=None`` fills the prompt. Tokens come from ``vocab`` or, with ``generate(tokenizer=...)``,
    from the ``*_pieces`` strings the tokenizer encodes to one token each."""

    seq_len: int = 8192
    n_records: int | None = None
    key_tokens: int = 2
    value_tokens: int = 2
    n_demos: int = 2
    residue_modulus: int = 24
    target_window: int = 120
    padding: str = "in_sequence"
    filler_tokens: int = 64
    vocab: Vocab = field(default_factory=Vocab.default)
    key_pieces: tuple[str, ...] | None = None
    value_pieces: tuple[str, ...] | None = None
    filler_pieces: tuple[str, ...] | None = None
    separator: str = "\n\n"
    target_record: int | None = None  # centre the target band on this record (1-based); None: the middle

    @classmethod
    def paper_protocol(cls, **overrides: Any) -> "NeedleRetrieval":
        """The paper's long-context protocol: 131,072-token prompts of 16,000 key-value records (4 key and
        4 value tokens each), the target band centred on the 249th record, residues mod 24. Profile it with
        ``phase_profile(model, task, n_per_residue=256, tokenizer=...)``. ``overrides`` replace any field."""
        settings = dict(seq_len=131072, n_records=16000, key_tokens=4, value_tokens=4, n_demos=2,
                        residue_modulus=24, target_window=120, filler_tokens=64, target_record=249)
        return cls(**{**settings, **overrides})

    def __post_init__(self) -> None:
        check_int("key_tokens", self.key_tokens, 1)
        check_int("value_tokens", self.value_tokens, 1)
        check_int("residue_modulus", self.residue_modulus, 1)
        check_int("n_demos", self.n_demos, 0)
        check_int("filler_tokens", self.filler_tokens, 0)
        check_int("target_window", self.target_window, 1)
        check_padding(self.padding)
        check_int("seq_len", self.seq_len, 1)
        if self.target_record is not None:
            check_int("target_record", self.target_record, 1)
        for name in ("key_pieces", "value_pieces", "filler_pieces"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        # Validate the geometry once with the vocabulary's pools.
        self._geometry(TokenPools.from_vocab(self.vocab))

    @property
    def record_len(self) -> int:
        return self.key_tokens + self.value_tokens

    def pools(self, tokenizer: Tokenizer | None = None) -> TokenPools:
        if tokenizer is None or isinstance(tokenizer, Vocab):
            return TokenPools.from_vocab(self.vocab if tokenizer is None else tokenizer)
        space = lambda words: tuple(" " + w for w in words)  # noqa: E731
        return TokenPools.from_tokenizer(tokenizer, self.key_pieces or space(self.vocab.keys),
                                         self.value_pieces or space(self.vocab.values),
                                         self.filler_pieces or space(self.vocab.fillers), self.separator)

    def _geometry(self, pools: TokenPools) -> dict[str, int]:
        """Record count, slack and the target band for these pools; raises when they cannot fit."""
        L = self.record_len
        fixed_without_records = len(pools.head) + len(pools.separator) + self.n_demos * L + self.key_tokens
        if self.n_records is None:
            n_records = (self.seq_len - fixed_without_records - self.filler_tokens) // L
        else:
            n_records = self.n_records
        n_codes = len(pools.key_ids) ** self.key_tokens
        if n_records < self.n_demos + 2 or n_records > n_codes:
            raise UserInputError(
                f"n_records={n_records} is out of range ({self.n_demos + 2}..{n_codes}: distinct "
                f"{self.key_tokens}-token keys from {len(pools.key_ids)} key tokens); "
                "adjust seq_len, n_records or key_tokens"
            )
        slack = self.seq_len - fixed_without_records - n_records * L
        if slack < 0:
            raise UserInputError(
                f"seq_len={self.seq_len} is too short for {n_records} records of {L} tokens "
                f"(needs >= {self.seq_len - slack})"
            )
        start = len(pools.head)
        if self.target_record is not None and self.target_record > n_records:
            raise UserInputError(f"target_record={self.target_record} is out of range 1..{n_records} (the records)")
        middle = (self.seq_len // 2 if self.target_record is None
                  else start + (self.target_record - 1) * L + slack * (self.target_record - 1) // n_records)
        lo = max(start, middle - self.target_window // 2)
        hi = min(start + slack + L * (n_records - 1), middle + (self.target_window - 1) // 2)
        check_target_band(
            lo, hi, self.residue_modulus,
            f"the target band {lo}..{hi} cannot realize every residue mod {self.residue_modulus} with matched "
            "moments",
            f"widen target_window (now {self.target_window}) or raise filler_tokens (slack is {slack}, needs "
            f">= {L - 1} to reach every position)",
        )
        return {"n_records": n_records, "slack": slack, "start": start, "lo": lo, "hi": hi}

    def length_padding(self, tokenizer: Tokenizer | None = None):
        """Extra filler for the prompt-length axis (`phaseinterp.tasks.length_axis`): the pools' fillers
        after the head."""
        pools = self.pools(tokenizer)
        return LengthPadding(len(pools.head), np.array(pools.filler_ids))

    def placement(self, n_per_residue: int, tokenizer: Tokenizer | None = None, *, strict: bool = True) -> TargetPlacement:
        g = self._geometry(self.pools(tokenizer))
        return match_target_moments(g["lo"], g["hi"], self.residue_modulus, n_per_residue, strict=strict)

    def _build(
        self, positions: np.ndarray, pools: TokenPools, geometry: dict[str, int], split: str, seed: int,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
        batch, n, L, kt = len(positions), geometry["n_records"], self.record_len, self.key_tokens
        slack, start = geometry["slack"], geometry["start"]
        key_ids, value_ids = np.array(pools.key_ids), np.array(pools.value_ids)
        n_key_codes = len(key_ids) ** kt
        n_value_codes = len(value_ids) ** self.value_tokens
        key_codes = np.stack([rng.choice(n_key_codes, size=n, replace=False) for _ in range(batch)])
        value_codes = rng.integers(0, n_value_codes, size=(batch, n))
        if split in SPLIT_PARITY:
            # Disjoint splits: redraw the last record's value until the mapping has the split's parity.
            parity = lambda: mapping_parity(hashed_pair_bits(key_codes, value_codes))  # noqa: E731
            while len(bad := np.flatnonzero(parity() != SPLIT_PARITY[split])):
                value_codes[bad, -1] = rng.integers(0, n_value_codes, size=len(bad))

        def digits(codes: np.ndarray, width: int, base: int) -> np.ndarray:
            return (codes[..., None] // base ** np.arange(width - 1, -1, -1)) % base

        records = np.concatenate([key_ids[digits(key_codes, kt, len(key_ids))],
                                  value_ids[digits(value_codes, self.value_tokens, len(value_ids))]], axis=-1)
        low, high = feasible_index_range(positions, start, L, slack, n)
        target = low + (rng.random(batch) * (high - low + 1)).astype(np.int64)
        gaps = filler_gaps(target, positions - start - L * target, slack, n, self.padding, rng)
        scores = rng.random((batch, n))
        scores[np.arange(batch), target] = np.inf
        demos = np.argsort(scores, axis=1)[:, : self.n_demos]
        rows = np.arange(batch)
        tail = np.concatenate([np.broadcast_to(np.array(pools.separator), (batch, len(pools.separator))),
                               records[rows[:, None], demos].reshape(batch, -1), records[rows, target, :kt]], axis=1)
        tokens, starts = lay_out(records, gaps, tail, self.seq_len, np.array(pools.head, dtype=np.int64),
                                  np.array(pools.filler_ids), rng)
        assert np.array_equal(starts[rows, target], positions)
        meta = pd.DataFrame(dict(mapping_id=np.arange(batch), target_pos=positions,
                                 residue=positions % self.residue_modulus, distance=self.seq_len - 1 - positions,
                                 target_index=target, first_record_pos=starts[:, 0], padding=self.padding,
                                 n_records=n, split=split, seed=seed))
        return tokens, records[rows, target, kt:], meta

    def generate(
        self, n_per_residue: int, seed: int = 0, *, tokenizer: Tokenizer | None = None, stride: int | None = None,
        residues: list[int] | None = None, strict: bool = True,
    ) -> TaskBatch:
        """``n_per_residue`` prompts per residue group (residue-major), moment-matched. Each group draws from
        its own seed stream, so ``residues=[...]`` gives exactly those groups' prompts of the full call.
        ``strict``: as in ``KeyValueRetrieval.generate``."""
        check_int("n_per_residue", n_per_residue, 1)
        if stride is not None:
            check_residue_modulus(self.residue_modulus, stride)
        pools = self.pools(tokenizer)
        geometry = self._geometry(pools)
        placement = match_target_moments(geometry["lo"], geometry["hi"], self.residue_modulus, n_per_residue,
                                         strict=strict)
        groups = residue_groups(residues, self.residue_modulus)
        parts = []
        for r in groups:
            rng = split_rng(seed, "eval", r)
            parts.append(self._build(rng.permutation(placement.positions[r]), pools, geometry, "eval", seed, rng))
        tokens, values, meta = joined_residue_groups(parts, n_per_residue, stride)
        moments = placement.moments()
        return self._batch(tokens, values, meta, moments[moments["residue"].isin(groups)].reset_index(drop=True))

    def calibration(self, n: int, seed: int = 0, *, tokenizer: Tokenizer | None = None) -> TaskBatch:
        """``n`` prompts with mappings disjoint from every :meth:`generate` mapping (parity bit 1)."""
        check_int("n", n, 1)
        pools = self.pools(tokenizer)
        geometry = self._geometry(pools)
        rng = split_rng(seed, "calibration")
        positions = residue_cycle_positions(n, geometry["lo"], geometry["hi"], self.residue_modulus, rng)
        tokens, values, meta = self._build(positions, pools, geometry, "calibration", seed, rng)
        return self._batch(tokens, values, meta, observed_moments(meta))

    def _batch(self, tokens: np.ndarray, values: np.ndarray, meta: pd.DataFrame, moments: pd.DataFrame) -> TaskBatch:
        return final_position_batch(self, tokens, values, meta, moments)
