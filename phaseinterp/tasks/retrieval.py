"""Key-value retrieval with phase as the only variable (docs/science.md section 3).

The moment-matched target placement is in `phaseinterp.tasks.placement`, the prompt
layout in `phaseinterp.tasks.layout`, the split parity in `phaseinterp.tasks.splits`.
"""

import functools
from dataclasses import dataclass, field

from typing import Any

import numpy as np
import pandas as pd
import torch

from phaseinterp.errors import UserInputError
from phaseinterp.phase import check_residue_modulus
from phaseinterp.tasks._serialize import TaskSettings
from phaseinterp.tasks.batches import TaskBatch, TrainBatch, observed_moments
from phaseinterp._checks import check_int
from phaseinterp.tasks.layout import check_padding, feasible_index_range, filler_gaps, lay_out
from phaseinterp.tasks.layout import residue_cycle_positions
from phaseinterp.tasks.placement import TargetPlacement, check_target_band, match_target_moments
from phaseinterp.tasks.splits import draw_mappings, split_rng
from phaseinterp.tasks.vocab import Vocab
from phaseinterp.tasks.length_axis import LengthPadding


@functools.lru_cache(maxsize=64)
def _cached_placement(lo: int, hi: int, modulus: int, n: int, strict: bool) -> TargetPlacement:
    """`match_target_moments`, solved once per argument set (deterministic; a report asks for the
    same placement many times). The positions are read-only: every caller shares them."""
    placement = match_target_moments(lo, hi, modulus, n, strict=strict)
    placement.positions.setflags(write=False)
    return placement


@dataclass(frozen=True, repr=False)
class KeyValueRetrieval(TaskSettings):
    """Single-token key-value retrieval with phase as the only variable (docs/science.md section 3).

    Prompt (``T = seq_len`` tokens, fixed)::

        <bos> [fillers] k1 v1 [fillers] k2 v2 ... kN vN [fillers] <sep> d1 w1 ... dD wD k*

    ``N = n_records`` records (distinct keys, distinct values), ``D = n_demos`` demonstration queries,
    and the target key ``k*`` at ``T - 1``, whose value the logits there must rank first. The target
    record's key sits at distance ``T - 1 - p`` in ``min_distance..max_distance``. ``padding``:
    ``"prefix"`` (records contiguous, slid by a filler run at the start) or ``"in_sequence"`` (fillers
    scattered over the gaps); both keep ``T`` and the query position fixed."""

    seq_len: int = 128
    n_records: int = 40
    n_demos: int = 4
    residue_modulus: int = 24
    min_distance: int = 34
    max_distance: int | None = None
    padding: str = "in_sequence"
    vocab: Vocab = field(default_factory=Vocab.default)

    def __post_init__(self) -> None:
        check_int("seq_len", self.seq_len, 8)
        check_int("residue_modulus", self.residue_modulus, 1)
        max_records = min(len(self.vocab.keys), len(self.vocab.values))
        check_int("n_records", self.n_records, 2, max_records)
        # Demonstrations query other records; querying most of them would let a model answer
        # the target by elimination.
        check_int("n_demos", self.n_demos, 0, (self.n_records - 1) // 2)
        check_padding(self.padding)
        if self.slack < 0:
            raise UserInputError(
                f"seq_len={self.seq_len} is too short for {self.n_records} records and {self.n_demos} demos "
                f"(needs >= {self.fixed_tokens} tokens)"
            )
        check_int("min_distance", self.min_distance, 1, self.seq_len - 2)
        if self.max_distance is not None:
            check_int("max_distance", self.max_distance, self.min_distance, self.seq_len - 2)
        lo, hi = self.target_range
        check_target_band(
            lo, hi, self.residue_modulus,
            f"seq_len={self.seq_len} is too short to realize every residue mod {self.residue_modulus} with "
            f"matched moments: the target key can only sit at positions {lo}..{hi}",
            "lengthen seq_len, or lower n_records/n_demos/min_distance",
        )

    # -------------------------------------------------------------- geometry
    @property
    def fixed_tokens(self) -> int:
        """<bos>, the records, <sep>, the demos and the query: everything but fillers."""
        return 2 * self.n_records + 2 * self.n_demos + 3

    @property
    def slack(self) -> int:
        """Filler tokens per prompt."""
        return self.seq_len - self.fixed_tokens

    @property
    def query_pos(self) -> int:
        return self.seq_len - 1

    @property
    def target_range(self) -> tuple[int, int]:
        """Positions the target key can take: distance range intersected with what the layout reaches."""
        max_distance = self.seq_len - 2 if self.max_distance is None else self.max_distance
        lo = max(1, self.query_pos - max_distance)
        hi = min(self.query_pos - self.min_distance, 1 + self.slack + 2 * (self.n_records - 1))
        return lo, hi

    def length_padding(self, tokenizer: Any = None):
        """Extra filler for the prompt-length axis (`phaseinterp.tasks.length_axis`): vocabulary fillers
        after ``<bos>``."""
        return LengthPadding(1, np.array(self.vocab.filler_ids))

    def placement(self, n_per_residue: int, *, strict: bool = True) -> TargetPlacement:
        """Moment-matched target positions for ``n_per_residue`` prompts per residue (see ``match_target_moments``)."""
        check_int("n_per_residue", n_per_residue, 1)
        lo, hi = self.target_range
        return _cached_placement(lo, hi, self.residue_modulus, n_per_residue, strict)

    # ------------------------------------------------------------- prompts
    def _build(
        self, positions: np.ndarray, split: str, seed: int, rng: np.random.Generator, mapping_rows: np.ndarray,
        keys: np.ndarray, values: np.ndarray,
    ) -> tuple[np.ndarray, pd.DataFrame, np.ndarray]:
        """Prompts whose target keys sit at ``positions``; ``mapping_rows`` picks each prompt's mapping."""
        batch, n, d = len(positions), self.n_records, self.n_demos
        key_ids, value_ids = np.array(self.vocab.key_ids), np.array(self.vocab.value_ids)
        # The mapping is a set of pairs; record order is drawn per prompt.
        order = np.argsort(rng.random((batch, n)), axis=1)
        k = np.take_along_axis(keys[mapping_rows], order, axis=1)
        v = np.take_along_axis(values[mapping_rows], order, axis=1)
        low, high = feasible_index_range(positions, 1, 2, self.slack, n)
        target = low + (rng.random(batch) * (high - low + 1)).astype(np.int64)
        gaps = filler_gaps(target, positions - 1 - 2 * target, self.slack, n, self.padding, rng)
        # Demos: D distinct records other than the target.
        scores = rng.random((batch, n))
        scores[np.arange(batch), target] = np.inf
        demos = np.argsort(scores, axis=1)[:, :d]
        rows = np.arange(batch)[:, None]
        tail = np.empty((batch, 2 * d + 2), dtype=np.int64)
        tail[:, 0] = self.vocab.sep_id
        tail[:, 1:-1:2] = key_ids[k[rows, demos]]
        tail[:, 2:-1:2] = value_ids[v[rows, demos]]
        tail[:, -1] = key_ids[k[np.arange(batch), target]]
        records = np.stack([key_ids[k], value_ids[v]], axis=-1)
        tokens, starts = lay_out(records, gaps, tail, self.seq_len, np.array([self.vocab.bos_id]),
                                 np.array(self.vocab.filler_ids), rng)
        assert np.array_equal(starts[np.arange(batch), target], positions)
        answer = value_ids[v[np.arange(batch), target]]
        meta = pd.DataFrame(dict(target_pos=positions, residue=positions % self.residue_modulus,
                                 distance=self.query_pos - positions, target_index=target,
                                 first_record_pos=starts[:, 0], target_key=tokens[:, -1], answer=answer,
                                 padding=self.padding, n_records=n, split=split, seed=seed))
        return tokens, meta, answer

    def _batch(self, tokens: np.ndarray, meta: pd.DataFrame, answer: np.ndarray, moments: pd.DataFrame) -> TaskBatch:
        batch = len(tokens)
        return TaskBatch(tokens=torch.as_tensor(tokens, dtype=torch.long),
                         answer=torch.as_tensor(answer, dtype=torch.long),
                         answer_pos=torch.full((batch,), self.query_pos, dtype=torch.long), meta=meta,
                         moments=moments, residue_modulus=self.residue_modulus, task=self.to_dict())

    def generate(
        self, n_per_residue: int, seed: int = 0, *, stride: int | None = None, n_mappings: int | None = None,
        strict: bool = True,
    ) -> TaskBatch:
        """``n_per_residue`` prompts for every residue ``r = 0..R-1`` (residue-major order).

        Target positions come from :meth:`placement` (:func:`match_target_moments`), shuffled within each
        group. Every prompt draws its own mapping unless ``n_mappings`` is given (a shared pool, in
        ``meta.mapping_id``; intervals then bootstrap over mappings). ``stride`` adds a ``phase`` column and
        requires ``S | R``. Sizes too small to match the moments raise unless ``strict=False``."""
        check_int("n_per_residue", n_per_residue, 1)
        if stride is not None:
            check_residue_modulus(self.residue_modulus, stride)
        placement = self.placement(n_per_residue, strict=strict)
        rng = split_rng(seed, "eval")
        positions = rng.permuted(placement.positions, axis=1).reshape(-1)
        total = len(positions)
        if n_mappings is None:
            mapping_rows = np.arange(total)
        else:
            check_int("n_mappings", n_mappings, 1, total)
            mapping_rows = rng.permutation(np.arange(total) % n_mappings)
        pool = total if n_mappings is None else n_mappings
        keys, values = draw_mappings(pool, self.n_records, len(self.vocab.keys), len(self.vocab.values), "eval", rng)
        tokens, meta, answer = self._build(positions, "eval", seed, rng, mapping_rows, keys, values)
        meta.insert(0, "mapping_id", mapping_rows)
        if stride is not None:
            meta.insert(meta.columns.get_loc("residue") + 1, "phase", positions % stride)
        return self._batch(tokens, meta, answer, placement.moments())

    def calibration(self, n: int, seed: int = 0) -> TaskBatch:
        """``n`` prompts whose mappings are disjoint from every :meth:`generate` mapping (parity bit 1,
        ``mapping_split``, and a separate seed stream). Residues cycle ``0..R-1``; positions are uniform over
        each residue's allowed positions (no moment matching)."""
        check_int("n", n, 1)
        rng = split_rng(seed, "calibration")
        positions = residue_cycle_positions(n, *self.target_range, self.residue_modulus, rng)
        keys, values = draw_mappings(n, self.n_records, len(self.vocab.keys), len(self.vocab.values), "calibration", rng)
        tokens, meta, answer = self._build(positions, "calibration", seed, rng, np.arange(n), keys, values)
        meta.insert(0, "mapping_id", np.arange(n))
        return self._batch(tokens, meta, answer, observed_moments(meta))

    # --------------------------------------------------------------- training
    def sample_train(
        self,
        batch_size: int,
        rng: np.random.Generator | int,
        *,
        n_records: int | tuple[int, int] | None = None,
        n_queries: int | None = None,
        query_distance: tuple[int, int] | None = None,
    ) -> TrainBatch:
        """Random training prompts: records, ``<sep>``, then a query section ``k v k v ...`` (no moment
        matching; laid out with this task's ``padding``).

        - ``n_records``: an int or an inclusive range ``(lo, hi)`` drawn per prompt (default: the task's).
        - ``n_queries``: queries per prompt; ``None`` fills the rest of the sequence after random padding.
        - ``query_distance``: ``(lo, hi)`` tokens from a queried record's key to the query key (uniform over
          all records when none is in range); ``hi < 3`` is refused.

        Otherwise queries draw records uniformly with replacement. ``answer_mask`` marks queried values,
        ``value_mask`` every value."""
        check_int("batch_size", batch_size, 1)
        if not isinstance(rng, np.random.Generator):
            rng = split_rng(rng, "train")
        max_records = min(len(self.vocab.keys), len(self.vocab.values))
        lo_n, hi_n = (self.n_records, self.n_records) if n_records is None else (
            (n_records, n_records) if isinstance(n_records, (int, np.integer)) else n_records
        )
        check_int("n_records (lower)", lo_n, 1, max_records)
        check_int("n_records (upper)", hi_n, lo_n, max_records)
        need = 2 * hi_n + 2 + 2 * (n_queries or 1)
        if need > self.seq_len:
            raise UserInputError(
                f"seq_len={self.seq_len} cannot hold {hi_n} records, <bos>, <sep> and {n_queries or 1} queries "
                f"({need} tokens)"
            )
        if n_queries is not None:
            check_int("n_queries", n_queries, 1)
        if query_distance is not None and not (1 <= query_distance[0] <= query_distance[1] and query_distance[1] >= 3):
            raise UserInputError(
                f"query_distance={query_distance} must satisfy 1 <= lo <= hi and hi >= 3: the first query key "
                "sits at least 3 tokens after the last record's key"
            )
        key_ids, value_ids = np.array(self.vocab.key_ids), np.array(self.vocab.value_ids)
        filler_ids = np.array(self.vocab.filler_ids)
        T = self.seq_len
        tokens = np.full((batch_size, T), self.vocab.pad_id, dtype=np.int64)
        answer = np.zeros((batch_size, T), dtype=bool)
        value = np.zeros((batch_size, T), dtype=bool)
        counts = rng.integers(lo_n, hi_n + 1, size=batch_size)
        for b, n in enumerate(counts.tolist()):
            keys, values = draw_mappings(1, n, len(key_ids), len(value_ids), "train", rng)
            free = T - 2 * n - 2
            if n_queries is None:
                slack = int(rng.integers(0, free - 2 + 1))
                n_q = (free - slack) // 2
                slack = free - 2 * n_q  # an odd leftover becomes padding
            else:
                n_q, slack = n_queries, free - 2 * n_queries
            target = np.array([int(rng.integers(0, n))])
            before = np.array([int(rng.integers(0, slack + 1))])
            gaps = filler_gaps(target, before, slack, n, self.padding, rng)
            records = np.stack([key_ids[keys[0]], value_ids[values[0]]], axis=-1)[None]
            sep_at = T - 2 * n_q - 1
            queried = self._draw_queries(rng, n, n_q, gaps[0], sep_at, query_distance)
            tail = np.empty((1, 2 * n_q + 1), dtype=np.int64)
            tail[0, 0] = self.vocab.sep_id
            tail[0, 1::2] = records[0, queried, 0]
            tail[0, 2::2] = records[0, queried, 1]
            row, starts = lay_out(records, gaps, tail, T, np.array([self.vocab.bos_id]), filler_ids, rng)
            tokens[b] = row[0]
            answer[b, sep_at + 1 : T : 2] = True  # positions of query keys predict their values
            value[b, starts[0]] = True
            value[b, sep_at + 1 : T : 2] = True
        targets = np.full_like(tokens, self.vocab.pad_id)
        targets[:, :-1] = tokens[:, 1:]
        return TrainBatch(tokens=torch.as_tensor(tokens), targets=torch.as_tensor(targets),
                          answer_mask=torch.as_tensor(answer), value_mask=torch.as_tensor(value),
                          n_records=torch.as_tensor(counts, dtype=torch.long))

    @staticmethod
    def _draw_queries(
        rng: np.random.Generator, n: int, n_q: int, gaps: np.ndarray, sep_at: int, distance: tuple[int, int] | None
    ) -> np.ndarray:
        if distance is None:
            return rng.integers(0, n, size=n_q)
        starts = 1 + np.cumsum(gaps[:n]) + 2 * np.arange(n)
        out = np.empty(n_q, dtype=np.int64)
        for q in range(n_q):
            d = sep_at + 1 + 2 * q - starts
            inside = np.flatnonzero((d >= distance[0]) & (d <= distance[1]))
            out[q] = rng.choice(inside) if len(inside) else rng.integers(0, n)
        return out
