"""Needle retrieval in natural text: `NeedleRetrieval`'s layout, padding and moment matching, with every
position outside the records, separator, demonstrations and final key holding held-out corpus text."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from phaseinterp._checks import check_int
from phaseinterp.errors import UserInputError
from phaseinterp.tasks.layout import check_padding
from phaseinterp.tasks.needle import NeedleRetrieval, TokenPools, encode_piece
from phaseinterp.tasks.splits import split_rng
from phaseinterp.tasks.length_axis import LengthPadding

_FILLER = -1  # marks the filler positions of a laid-out prompt until text replaces them
MIN_PIECES = 16  # key and value pieces each: fewer cannot hold distinct records and a fair chance level
_WORD = re.compile(r"^ [a-z]{3,12}$")


@dataclass(frozen=True, repr=False)
class TextNeedle(NeedleRetrieval):
    """`NeedleRetrieval` whose haystack is natural text (module docstring).

    Records are ``key_tokens`` key pieces then ``value_tokens`` value pieces, single-token words of
    the tokenizer (``key_ids``, ``value_ids``, disjoint). ``filler_text`` is held-out corpus text
    (token ids), at least ``seq_len`` long; each prompt reads a span at a random offset. Scoring as in
    `NeedleRetrieval`: full-vocabulary top-1 of the target's first value token at ``T - 1``; chance is
    ``1 / len(value_ids)``.
    """

    seq_len: int = 512
    n_records: int | None = 8
    filler_tokens: int = 0
    residue_modulus: int = 24
    key_ids: tuple[int, ...] = ()
    value_ids: tuple[int, ...] = ()
    separator_ids: tuple[int, ...] = ()
    filler_text: tuple[int, ...] = ()

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, heldout: np.ndarray, *, n_pieces: int = 64, filler_chars: int = 0,
                       **settings: Any) -> "TextNeedle":
        """Key and value words from `pieces` (``n_pieces`` each), and the first ``settings['seq_len'] * 64``
        held-out tokens as filler text."""
        keys, values = cls.pieces(tokenizer, n_pieces)
        seq_len = settings.get("seq_len", cls.seq_len)
        text = np.asarray(heldout[: seq_len * 64], dtype=np.int64)
        if len(text) <= seq_len:
            raise UserInputError(f"the held-out text has {len(text)} tokens; the needle task needs more than seq_len="
                                 f"{seq_len} (raise heldout_fraction or use a larger corpus)")
        separator = tuple(encode_piece(tokenizer, "\n\n")) or tuple(encode_piece(tokenizer, "\n"))
        return cls(key_ids=keys, value_ids=values, separator_ids=separator, filler_text=tuple(int(t) for t in text),
                   **settings)

    @staticmethod
    def pieces(tokenizer: Any, n_pieces: int = 64) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Key and value ids: alternate single-token lowercase words of the tokenizer, after skipping the
        commonest (BPE ids follow merge order): up to 100 of them, as many as leave `MIN_PIECES` per pool.
        Refused, before any corpus is read, when the vocabulary has too few such words."""
        check_int("n_pieces", n_pieces, MIN_PIECES)
        words = []
        for i in range(len(tokenizer)):
            piece = tokenizer.decode([i])
            if _WORD.match(piece) and encode_piece(tokenizer, piece) == [i]:
                words.append(i)
        if len(words) < 2 * MIN_PIECES:
            raise UserInputError(f"the tokenizer ({len(tokenizer)} tokens) has {len(words)} single-token lowercase "
                                 f"words; the needle task needs >= {2 * MIN_PIECES} (key and value pools of "
                                 f"{MIN_PIECES}): train a larger vocabulary")
        words = words[min(100, len(words) - 2 * MIN_PIECES):]
        n = min(n_pieces, len(words) // 2)
        return tuple(words[0 : 2 * n : 2]), tuple(words[1 : 2 * n : 2])

    def __post_init__(self) -> None:
        for name in ("key_tokens", "value_tokens", "residue_modulus", "target_window", "seq_len"):
            check_int(name, getattr(self, name), 1)
        check_int("n_demos", self.n_demos, 0)
        check_int("filler_tokens", self.filler_tokens, 0)
        check_padding(self.padding)
        for name in ("key_ids", "value_ids", "separator_ids", "filler_text"):
            object.__setattr__(self, name, tuple(int(i) for i in getattr(self, name)))
        if len(self.key_ids) < 2 or len(self.value_ids) < 2:
            raise UserInputError(f"key_ids ({len(self.key_ids)}) and value_ids ({len(self.value_ids)}) need >= 2 "
                                 "tokens each (build the task with TextNeedle.from_tokenizer)")
        if set(self.key_ids) & set(self.value_ids):
            raise UserInputError(f"key_ids and value_ids share token ids {sorted(set(self.key_ids) & set(self.value_ids))}")
        if len(self.filler_text) <= self.seq_len:
            raise UserInputError(f"filler_text has {len(self.filler_text)} tokens; it must be longer than seq_len="
                                 f"{self.seq_len}")
        self._geometry(self.pools())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TextNeedle":
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}  # JSON gives lists
        return super().from_dict(d)

    def length_padding(self, tokenizer: Any = None):
        """Extra filler for the prompt-length axis: a contiguous span of the held-out filler text."""
        return LengthPadding(0, np.asarray(self.filler_text), contiguous=True)

    def pools(self, tokenizer: Any = None) -> TokenPools:
        return TokenPools(self.key_ids, self.value_ids, (_FILLER,), (), self.separator_ids)

    def _build(self, positions, pools, geometry, split, seed, rng):
        tokens, values, meta = super()._build(positions, pools, geometry, split, seed, rng)
        return self._fill(tokens, np.asarray(self.filler_text), rng), values, meta

    @staticmethod
    def _fill(tokens: np.ndarray, text: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Every filler position of each row, in order, gets a contiguous span of ``text``."""
        tokens = tokens.copy()
        for row in tokens:
            where = np.flatnonzero(row == _FILLER)
            offset = int(rng.integers(0, len(text) - len(where) + 1))
            row[where] = text[offset : offset + len(where)]
        return tokens

    def training_rows(self, n: int, seed: int, text: np.ndarray) -> Int[Tensor, "n seq_plus_one"]:
        """``n`` prompts of ``seq_len + 1`` tokens for language-model training: the prompt, its filler
        from ``text`` (the training split, never ``filler_text``), then the target's first value token.
        Mappings and positions come from the ``"train"`` seed stream (never an evaluation prompt's)."""
        check_int("n", n, 1)
        if len(text) <= self.seq_len:
            raise UserInputError(f"the training text has {len(text)} tokens; needle rows need more than seq_len="
                                 f"{self.seq_len}")
        pools = self.pools()
        geometry = self._geometry(pools)
        rng = split_rng(seed, "train")
        positions = rng.integers(geometry["lo"], geometry["hi"] + 1, size=n)
        tokens, values, _ = NeedleRetrieval._build(self, positions, pools, geometry, "train", seed, rng)
        offset = int(rng.integers(0, len(text) - self.seq_len))
        window = np.asarray(text[offset : offset + self.seq_len], dtype=np.int64)  # one read, spans cut from it
        tokens = self._fill(tokens, window, rng)
        return torch.from_numpy(np.concatenate([tokens, values[:, :1]], axis=1).astype(np.int64))
