"""In-context copying of a random span in natural text, scored by the phase of the copied token's source.

A prompt is held-out text with a span of ``span_tokens`` random tokens set in at ``span_start``; it ends
with the span's first ``prefix_tokens`` tokens again, and the answer is the span's next token ``span[j]``
(top-1 at ``T - 1``). Its source sits at ``target_pos = span_start + j``, moment-matched across residue
groups (`match_target_moments`); chance is ``1 / len(token_ids)``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
from jaxtyping import Int

from phaseinterp._checks import check_int
from phaseinterp.errors import UserInputError
from phaseinterp.phase import check_residue_modulus
from phaseinterp.tasks._serialize import TaskSettings, task_from_fields
from phaseinterp.tasks.batches import (TaskBatch, final_position_batch, joined_residue_groups, observed_moments,
                                       residue_groups)
from phaseinterp.tasks.layout import residue_cycle_positions
from phaseinterp.tasks.placement import TargetPlacement, check_target_band, match_target_moments
from phaseinterp.tasks.splits import split_rng

MIN_POOL = 64  # span tokens to draw from: fewer make spans repeat across prompts and chance level high


@dataclass(frozen=True, repr=False)
class SpanCopy(TaskSettings):
    """Copy a random span that appeared earlier in natural text (module docstring).

    ``token_ids``: the pool of span tokens (distinct within a span). ``filler_text``: held-out token ids,
    longer than ``seq_len``. ``min_gap``: at least that many tokens between the span and its repeat.
    ``target_window``: the source positions' band (None: the whole feasible range)."""

    seq_len: int = 256
    span_tokens: int = 8
    prefix_tokens: int = 4
    min_gap: int = 32
    residue_modulus: int = 24
    target_window: int | None = None
    token_ids: tuple[int, ...] = ()
    filler_text: tuple[int, ...] = ()

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, heldout: Any, *, filler_tokens: int | None = None,
                       **settings: Any) -> "SpanCopy":
        """The task on ``heldout`` (a corpus's held-out token ids): the first ``filler_tokens`` (default
        ``seq_len * 256``) as filler text, and as span pool every token id that occurs there, except the
        tokenizer's special tokens (an id the model never saw in training has an untrained embedding,
        so copying it would test the embedding, not the copying)."""
        seq_len = settings.get("seq_len", cls.seq_len)
        check_int("seq_len", seq_len, 1)
        filler_tokens = seq_len * 256 if filler_tokens is None else check_int("filler_tokens", filler_tokens, 1)
        text = np.asarray(heldout[:filler_tokens], dtype=np.int64)
        if len(text) <= seq_len:
            raise UserInputError(f"the held-out text has {len(text)} tokens; span copying needs more than seq_len="
                                 f"{seq_len} (raise heldout_fraction or use a larger corpus)")
        special = set(special_ids(tokenizer))
        seen = np.unique(np.asarray(heldout, dtype=np.int64))
        pool = tuple(int(t) for t in seen if int(t) not in special)
        return cls(token_ids=pool, filler_text=tuple(int(t) for t in text), **settings)

    def __post_init__(self) -> None:
        check_int("seq_len", self.seq_len, 2)
        check_int("span_tokens", self.span_tokens, 2)
        check_int("prefix_tokens", self.prefix_tokens, 1, self.span_tokens - 1,
                  why=" (the prompt repeats that many span tokens and asks for the next one)")
        check_int("min_gap", self.min_gap, 0)
        check_int("residue_modulus", self.residue_modulus, 1)
        if self.target_window is not None:
            check_int("target_window", self.target_window, 1)
        for name in ("token_ids", "filler_text"):
            object.__setattr__(self, name, tuple(int(i) for i in getattr(self, name)))
        if len(set(self.token_ids)) < max(MIN_POOL, self.span_tokens):
            raise UserInputError(f"token_ids holds {len(set(self.token_ids))} distinct tokens; span copying needs >= "
                                 f"{max(MIN_POOL, self.span_tokens)} (build the task with SpanCopy.from_tokenizer)")
        if min(self.token_ids) < 0 or (self.filler_text and min(self.filler_text) < 0):
            raise UserInputError("token_ids and filler_text must be non-negative token ids")
        if len(self.filler_text) <= self.seq_len:
            raise UserInputError(f"filler_text has {len(self.filler_text)} tokens; it must be longer than seq_len="
                                 f"{self.seq_len}")
        self.band()

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d = {name: list(v) if isinstance(v, tuple) else v for name, v in d.items()}
        return {"kind": type(self).__name__, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpanCopy":
        return task_from_fields(cls, {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})  # JSON: lists

    def band(self) -> tuple[int, int]:
        """The source positions ``lo..hi`` the placement draws from; refused when they cannot realize
        every residue with matched moments."""
        j, k, T = self.prefix_tokens, self.span_tokens, self.seq_len
        lo, hi = j, T - k - self.min_gap  # span_start >= 0; span end + min_gap <= the repeat at T - j
        if self.target_window is not None and self.target_window < hi - lo + 1:
            middle = (lo + hi) // 2
            lo, hi = middle - self.target_window // 2, middle + (self.target_window - 1) // 2
        check_target_band(
            lo, hi, self.residue_modulus,
            f"the source band {lo}..{hi} cannot realize every residue mod {self.residue_modulus} with matched moments",
            f"lengthen seq_len (now {T}), shorten span_tokens ({k}) or min_gap ({self.min_gap}), or widen "
            f"target_window ({self.target_window})",
        )
        return lo, hi

    def placement(self, n_per_residue: int, tokenizer: Any = None, *, strict: bool = True) -> TargetPlacement:
        lo, hi = self.band()
        return match_target_moments(lo, hi, self.residue_modulus, n_per_residue, strict=strict)

    def _build(self, positions: np.ndarray, split: str, seed: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
        """Prompts whose answer's source sits at ``positions``: text, span, text, the span's first j tokens."""
        batch, j, k, T = len(positions), self.prefix_tokens, self.span_tokens, self.seq_len
        pool, text = np.asarray(self.token_ids), np.asarray(self.filler_text)
        spans = pool[np.argsort(rng.random((batch, len(pool))), axis=1)[:, :k]]  # distinct within a span
        n_text = T - k - j
        offsets = rng.integers(0, len(text) - n_text + 1, size=batch)
        starts = positions - j
        tokens = np.empty((batch, T), dtype=np.int64)
        for b in range(batch):
            filler = text[offsets[b] : offsets[b] + n_text]
            s = starts[b]
            tokens[b, :s] = filler[:s]
            tokens[b, s : s + k] = spans[b]
            tokens[b, s + k : T - j] = filler[s:]
            tokens[b, T - j :] = spans[b, :j]
        meta = pd.DataFrame({
            "mapping_id": np.arange(batch),
            "target_pos": positions,
            "residue": positions % self.residue_modulus,
            "distance": T - 1 - positions,
            "span_start": starts,
            "filler_offset": offsets,
            "split": split,
            "seed": seed,
        })
        return tokens, spans[:, j:], meta

    def generate(self, n_per_residue: int, seed: int = 0, *, tokenizer: Any = None, stride: int | None = None,
                 residues: list[int] | None = None, strict: bool = True) -> TaskBatch:
        """``n_per_residue`` prompts per residue group (residue-major), source positions moment-matched;
        each group has its own seed stream, so ``residues=[...]`` gives exactly those groups' prompts of
        the full call. ``tokenizer`` is accepted for `phase_profile` and unused (the task holds ids).
        ``answer_tokens`` holds the rest of the span from the answer on."""
        check_int("n_per_residue", n_per_residue, 1)
        if stride is not None:
            check_residue_modulus(self.residue_modulus, stride)
        placement = self.placement(n_per_residue, strict=strict)
        groups = residue_groups(residues, self.residue_modulus)
        parts = []
        for r in groups:
            rng = split_rng(seed, "eval", r)
            parts.append(self._build(rng.permutation(placement.positions[r]), "eval", seed, rng))
        tokens, answers, meta = joined_residue_groups(parts, n_per_residue, stride)
        moments = placement.moments()
        return self._batch(tokens, answers, meta, moments[moments["residue"].isin(groups)].reset_index(drop=True))

    def calibration(self, n: int, seed: int = 0, *, tokenizer: Any = None) -> TaskBatch:
        """``n`` prompts from the calibration seed stream (residues cycling, positions uniform per
        residue, no moment matching): the mean activations of an ablation come from here."""
        check_int("n", n, 1)
        lo, hi = self.band()
        rng = split_rng(seed, "calibration")
        positions = residue_cycle_positions(n, lo, hi, self.residue_modulus, rng)
        tokens, answers, meta = self._build(positions, "calibration", seed, rng)
        return self._batch(tokens, answers, meta, observed_moments(meta))

    def _batch(self, tokens: Int[np.ndarray, "batch pos"], answers: Int[np.ndarray, "batch rest"],
               meta: pd.DataFrame, moments: pd.DataFrame) -> TaskBatch:
        return final_position_batch(self, tokens, answers, meta, moments)


def special_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's special tokens (end of text, padding, ...): never span or answer tokens."""
    ids = set()
    for name in ("eos_id", "eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            ids.add(value)
    ids.update(int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ())
    return sorted(ids)
