"""Identifier recall in real code, scored by the phase of the identifier's token at its definition.

A case is an identifier **defined** at D (an assignment, ``def``, a parameter, ``class``, ``for``, ``as``;
any occurrence with ``sources="any"``) and **used** at U, its next occurrence, spelled by the same two or
more tokens. The prompt is the ``seq_len`` tokens ending inside the use after its first ``i >= 1`` tokens;
the answer is the use's token ``i`` (top-1 at ``T - 1``) and the **source** is token ``i`` at the
definition (``target_pos``), the only earlier occurrence, ``min_distance .. max_distance`` before the
answer. Residue groups are balanced by selection (`select_matched`); ``control=True`` replaces the
identifier at the definition by another one."""

from __future__ import annotations

import bisect
import functools
import keyword
import math
import re
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Int

from phaseinterp._checks import check_int
from phaseinterp.errors import UserInputError
from phaseinterp.phase import check_residue_modulus
from phaseinterp.tasks._serialize import TaskSettings, pack_tokens, task_from_fields, unpack_tokens
from phaseinterp.tasks.batches import TaskBatch, observed_moments, residue_groups
from phaseinterp.tasks.copying import special_ids
from phaseinterp.tasks.placement import MEAN_TOLERANCE, STD_TOLERANCE, check_tolerances
from phaseinterp.tasks.splits import split_rng

SOURCES = ("definitions", "any")
CALIBRATION_SHARE = 8  # one case pair in 8 (by a hash of its use) is kept for calibration, never evaluated
_SEPARATOR = "\x00"  # what a special token (end of text) reads as: no name or definition spans it
_NAME = re.compile(r"(?<![\w])[A-Za-z_]\w*")
_DEFINITIONS = (
    ("def", re.compile(r"\bdef[ \t]+([A-Za-z_]\w*)")),
    ("class", re.compile(r"\bclass[ \t]+([A-Za-z_]\w*)")),
    ("assign", re.compile(r"^[ \t]*([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)", re.M)),
    ("for", re.compile(r"\bfor[ \t]+([A-Za-z_]\w*)[ \t]+in\b")),
    ("as", re.compile(r"\bas[ \t]+([A-Za-z_]\w*)")),
)
_PARAMETERS = re.compile(r"\bdef[ \t]+\w+[ \t]*\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
_PARAMETER = re.compile(r"^\s*\**\s*([A-Za-z_]\w*)")
_CONTENT = re.compile(r"[A-Za-z0-9]")


def _top_level_commas(text: str) -> list[int]:
    """Offsets where ``text`` (a parameter list) splits into parameters: commas outside brackets."""
    depth, cuts = 0, [0]
    for k, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            cuts.append(k + 1)
    return cuts


def definitions(text: str) -> list[tuple[int, str, str]]:
    """``(char offset, name, kind)`` of every definition the module docstring lists, in ``text``."""
    found = [(m.start(1), m.group(1), kind) for kind, rx in _DEFINITIONS for m in rx.finditer(text)]
    for m in _PARAMETERS.finditer(text):
        params = m.group(1)
        for cut in _top_level_commas(params):
            p = _PARAMETER.match(params[cut:].split(",", 1)[0])
            if p:
                found.append((m.start(1) + cut + p.start(1), p.group(1), "param"))
    return sorted({f for f in found if not keyword.iskeyword(f[1])})


@dataclass(frozen=True, repr=False)
class IdentifierRecall(TaskSettings):
    """Recall an identifier's next token at its use from its definition (module docstring).

    ``text``: held-out corpus token ids; ``token_text``: the text of every token id (special tokens read
    as ``""``). ``sources``: ``"definitions"`` or ``"any"``. ``control``: the no-definition control. One
    case pair in `CALIBRATION_SHARE` serves `calibration` only."""

    seq_len: int = 256
    residue_modulus: int = 24
    min_distance: int = 32
    max_distance: int = 223
    sources: str = "definitions"
    control: bool = False
    text: tuple[int, ...] = ()
    token_text: tuple[str, ...] = ()

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, heldout: Any, *, max_tokens: int | None = None,
                       **settings: Any) -> "IdentifierRecall":
        """The task on the first ``max_tokens`` (default all) of ``heldout``, a corpus's held-out ids."""
        text = np.asarray(heldout if max_tokens is None else heldout[: check_int("max_tokens", max_tokens, 1)],
                          dtype=np.int64)
        special = set(special_ids(tokenizer))
        pieces = tuple("" if i in special else tokenizer.decode([i]) for i in range(len(tokenizer)))
        return cls(text=tuple(int(t) for t in text), token_text=pieces, **settings)

    def __post_init__(self) -> None:
        check_int("seq_len", self.seq_len, 2)
        check_int("residue_modulus", self.residue_modulus, 1)
        check_int("min_distance", self.min_distance, 1, self.seq_len - 2)
        check_int("max_distance", self.max_distance, self.min_distance, self.seq_len - 2,
                  why=" (the source must lie in the prompt, after its first token)")
        if self.sources not in SOURCES:
            raise UserInputError(f"sources={self.sources!r} is not one of {SOURCES}")
        if not isinstance(self.control, bool):
            raise UserInputError(f"control={self.control!r} must be True or False")
        object.__setattr__(self, "text", tuple(int(t) for t in self.text))
        object.__setattr__(self, "token_text", tuple(str(t) for t in self.token_text))
        if len(self.text) <= self.seq_len:
            raise UserInputError(f"text has {len(self.text)} tokens; identifier recall needs more than seq_len="
                                 f"{self.seq_len} (build the task with IdentifierRecall.from_tokenizer)")
        if min(self.text) < 0 or max(self.text) >= len(self.token_text):
            raise UserInputError(f"text holds token ids outside 0..{len(self.token_text) - 1} (the ids token_text "
                                 "spells): token_text must come from the text's tokenizer")
        lo, hi = self.band()
        if hi - lo + 1 < 2 * self.residue_modulus:
            raise UserInputError(f"min_distance={self.min_distance}..max_distance={self.max_distance} leaves "
                                 f"{hi - lo + 1} source positions; matching moments across {self.residue_modulus} "
                                 f"residues needs >= {2 * self.residue_modulus}")

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON values; ``text`` packed (`pack_tokens`: about 0.9 MB per million tokens)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
        return {"kind": type(self).__name__, **d, "text": pack_tokens(self.text)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "IdentifierRecall":
        d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}  # JSON: lists
        if "text" in d:
            d["text"] = unpack_tokens(d["text"])
        return task_from_fields(cls, d)

    def band(self) -> tuple[int, int]:
        """Source positions ``lo..hi`` of the prompts (the answer is predicted at ``seq_len - 1``)."""
        return self.seq_len - 1 - self.max_distance, self.seq_len - 1 - self.min_distance

    # ------------------------------------------------------------------ cases
    def cases(self) -> pd.DataFrame:
        """Every case of the text, one row each (module docstring): ``pair`` (one per definition-use
        pair), ``name``, ``kind``, ``n_tokens``, ``answer_index`` (i), text indices ``def_start``,
        ``use_start``, ``answer_at``, ``source_at``, the prompt's ``window_start`` and ``target_pos``,
        the ``answer`` id, and ``split`` (eval or calibration). Computed once per task."""
        return _cases(self._case_key())

    def _case_key(self) -> tuple:
        return (self.text, self.token_text, self.seq_len, self.min_distance, self.max_distance, self.sources)

    def availability(self) -> pd.DataFrame:
        """Evaluation cases per residue of the source position (what `generate` selects from): the
        largest ``n_per_residue`` is their minimum, a little less when the moments must match."""
        cases = self.cases()
        cases = cases[cases["split"] == "eval"]
        counts = np.bincount(cases["target_pos"] % self.residue_modulus, minlength=self.residue_modulus)
        return pd.DataFrame({"residue": np.arange(self.residue_modulus), "cases": counts})

    def capacity(self) -> int:
        """The largest ``n_per_residue`` whose selection matches the moments (0 when none does)."""
        low, high = 0, int(self.availability()["cases"].min())
        while low < high:
            mid = (low + high + 1) // 2
            if self._select(mid, 0, strict=False)[1]["within_tolerance"].all():
                low = mid
            else:
                high = mid - 1
        return low

    def placement(self, n_per_residue: int, tokenizer: Any = None, *, strict: bool = True) -> pd.DataFrame:
        """The moments the selection achieves for ``n_per_residue`` (a check before a long run)."""
        return self._select(n_per_residue, 0, strict)[1]

    def _select(self, n: int, seed: int, strict: bool) -> tuple[list[np.ndarray], pd.DataFrame]:
        check_int("n_per_residue", n, 1)
        cases = self.cases()
        cases = cases[cases["split"] == "eval"]
        R = self.residue_modulus
        by_residue = [cases.index[cases["target_pos"] % R == r].to_numpy() for r in range(R)]
        short = [r for r in range(R) if len(by_residue[r]) < n]
        if short:
            counts = [len(g) for g in by_residue]
            raise UserInputError(
                f"n_per_residue={n} is more than the {min(counts)} identifier cases of residue {short[0]} (cases per "
                f"residue {min(counts)}..{max(counts)} in {len(self.text):,} tokens); ask for <= {min(counts)}, "
                "use sources='any', a wider min_distance..max_distance or more held-out text")
        positions = [cases.loc[g, "target_pos"].to_numpy() for g in by_residue]
        counts, moments = select_matched(positions, n, R)
        if strict and not moments["within_tolerance"].all():
            raise UserInputError(
                f"n_per_residue={n}: the identifier cases cannot match the source position's moments across the "
                f"{R} residues (mean spread {np.ptp(moments['mean']):.2f} tokens, std spread "
                f"{np.ptp(moments['std']) / moments['target_std'].iloc[0]:.1%}); ask for <= {self.capacity()} "
                "(IdentifierRecall.capacity()) but not a handful (a few dozen or more hold the std), or pass "
                "strict=False")
        chosen = []
        for r in range(R):
            rng = split_rng(seed, "eval", r)
            picks = []
            for p, c in counts[r].items():
                at = by_residue[r][positions[r] == p]
                picks.append(at[np.argsort(rng.random(len(at)))[:c]])
            chosen.append(np.sort(np.concatenate(picks)))
        return chosen, moments

    # ------------------------------------------------------------------ prompts
    def generate(self, n_per_residue: int, seed: int = 0, *, tokenizer: Any = None, stride: int | None = None,
                 residues: list[int] | None = None, strict: bool = True) -> TaskBatch:
        """``n_per_residue`` prompts per residue group (residue-major), selected so the source position's
        moments match across groups; ``tokenizer`` is accepted for `phase_profile` and unused. Prompts
        of one definition-use pair share a ``mapping_id`` (so intervals bootstrap over pairs)."""
        if stride is not None:
            check_residue_modulus(self.residue_modulus, stride)
        groups = residue_groups(residues, self.residue_modulus)
        chosen, moments = self._select(n_per_residue, seed, strict)
        rows = self.cases().loc[np.concatenate([chosen[r] for r in groups])]
        batch = self._batch(rows, "eval", seed, moments[moments["residue"].isin(groups)].reset_index(drop=True))
        if stride is not None:
            batch.meta.insert(batch.meta.columns.get_loc("residue") + 1, "phase", batch.meta["target_pos"] % stride)
        return batch

    def calibration(self, n: int, seed: int = 0, *, tokenizer: Any = None) -> TaskBatch:
        """``n`` prompts from the calibration pairs (never in `generate`), residues as they fall."""
        check_int("n", n, 1)
        cases = self.cases()
        cases = cases[cases["split"] == "calibration"]
        if len(cases) == 0:
            raise UserInputError(f"the text ({len(self.text):,} tokens) holds no calibration cases; use more text")
        rng = split_rng(seed, "calibration")
        rows = cases.iloc[rng.choice(len(cases), size=n, replace=n > len(cases))]
        meta_rows = rows.assign(residue=rows["target_pos"] % self.residue_modulus)
        return self._batch(rows, "calibration", seed, observed_moments(meta_rows))

    def _batch(self, rows: pd.DataFrame, split: str, seed: int, moments: pd.DataFrame) -> TaskBatch:
        text = np.asarray(self.text, dtype=np.int64)
        T = self.seq_len
        starts = rows["window_start"].to_numpy()
        tokens = text[starts[:, None] + np.arange(T)[None, :]]
        replaced = np.full(len(rows), -1)
        if self.control:
            tokens, replaced = self._replace_definitions(tokens, rows, seed)
        meta = pd.DataFrame({
            "mapping_id": rows["pair"].to_numpy(),
            "target_pos": rows["target_pos"].to_numpy(),
            "residue": rows["target_pos"].to_numpy() % self.residue_modulus,
            "distance": T - 1 - rows["target_pos"].to_numpy(),
            "name": rows["name"].to_numpy(),
            "kind": rows["kind"].to_numpy(),
            "n_tokens": rows["n_tokens"].to_numpy(),
            "answer_index": rows["answer_index"].to_numpy(),
            "window_start": starts,
            "control": self.control,
            "replaced_by": replaced,
            "split": split,
            "seed": seed,
            "answer": rows["answer"].to_numpy(),
        })
        return TaskBatch(
            tokens=torch.as_tensor(tokens, dtype=torch.long),
            answer=torch.tensor(rows["answer"].to_numpy(), dtype=torch.long),
            answer_pos=torch.full((len(rows),), T - 1, dtype=torch.long),
            meta=meta,
            moments=moments,
            residue_modulus=self.residue_modulus,
            task=self.to_dict(),
        )

    def _replace_definitions(self, tokens: Int[np.ndarray, "batch pos"], rows: pd.DataFrame, seed: int
                             ) -> tuple[Int[np.ndarray, "batch pos"], Int[np.ndarray, " batch"]]:
        """Each prompt's identifier at its definition becomes another case's identifier of as many tokens,
        one without the answer token (a seeded pick, the same for every residue)."""
        text = np.asarray(self.text, dtype=np.int64)
        everything = self.cases().drop_duplicates("pair")
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(9,)))
        tokens = tokens.copy()
        donors = np.empty(len(rows), dtype=np.int64)
        for b, row in enumerate(rows.itertuples()):
            # an identifier of as many tokens when there is one, else another's tokens cut or repeated to fit
            others = everything[everything["name"] != row.name]
            order = np.lexsort((rng.random(len(others)), others["n_tokens"].to_numpy() != row.n_tokens))
            for donor in others.iloc[order].itertuples():
                ids = np.resize(text[donor.def_start : donor.def_start + donor.n_tokens], row.n_tokens)
                if row.answer not in ids:
                    break
            else:
                raise UserInputError(f"no other identifier without the answer can replace {row.name!r}; use more text")
            at = row.def_start - row.window_start
            tokens[b, max(at, 0) : at + row.n_tokens] = ids[max(-at, 0) :]
            donors[b] = donor.pair
        return tokens, donors


@functools.lru_cache(maxsize=4)
def _cases(key: tuple) -> pd.DataFrame:
    text_ids, token_text, T, min_distance, max_distance, sources = key
    ids = np.asarray(text_ids, dtype=np.int64)
    pieces = [t if t else _SEPARATOR for t in token_text]
    lengths = np.array([len(p) for p in pieces])
    starts = np.concatenate([[0], np.cumsum(lengths[ids])])  # char offset of every token
    text = "".join(pieces[i] for i in ids)
    token_at = np.searchsorted(starts, np.arange(len(text)), side="right") - 1
    occurrences: dict[str, list[int]] = {}
    for m in _NAME.finditer(text):
        occurrences.setdefault(m.group(), []).append(m.start())
    if sources == "definitions":
        found = definitions(text)
    else:
        found = [(c, name, "any") for name, at in occurrences.items() for c in at]
    separators = np.flatnonzero(np.array([t == _SEPARATOR for t in pieces])[ids])
    lo, hi = T - 1 - max_distance, T - 1 - min_distance

    def token_span(c: int, name: str) -> tuple[int, int] | None:
        """The tokens that spell ``name`` at char ``c``, when they start and end with it (the first may
        carry one leading space)."""
        a = int(token_at[c])
        if not (starts[a] == c or (starts[a] == c - 1 and text[c - 1] == " ")):
            return None
        end = c + len(name)
        b = int(token_at[end - 1]) + 1
        return (a, b) if starts[b] == end else None

    rows = []
    for c, name, kind in found:
        at = occurrences.get(name, [])
        k = bisect.bisect_left(at, c)
        if k >= len(at) - 1 or at[k] != c:
            continue
        use = at[k + 1]
        d, u = token_span(c, name), token_span(use, name)
        if d is None or u is None or d[1] - d[0] < 2 or d[1] - d[0] != u[1] - u[0]:
            continue
        m = d[1] - d[0]
        if not np.array_equal(ids[d[0] + 1 : d[1]], ids[u[0] + 1 : u[1]]) or \
                pieces[ids[d[0]]].lstrip(" ") != pieces[ids[u[0]]].lstrip(" "):
            continue
        if bisect.bisect_left(separators, d[0]) != bisect.bisect_left(separators, u[0]):
            continue  # another document
        previous = at[k - 1] if k > 0 else -1
        for i in range(1, m):
            if not _CONTENT.search(pieces[ids[d[0] + i]]):
                continue
            answer_at, source_at = u[0] + i, d[0] + i
            window = answer_at - T
            target = source_at - window
            if window < 0 or not lo <= target <= hi or previous >= starts[window]:
                continue
            rows.append((c, name, kind, m, i, d[0], u[0], answer_at, source_at, window, target, int(ids[answer_at])))
    columns = ["def_char", "name", "kind", "n_tokens", "answer_index", "def_start", "use_start", "answer_at",
               "source_at", "window_start", "target_pos", "answer"]
    frame = pd.DataFrame(rows, columns=columns)
    frame.insert(0, "pair", pd.factorize(frame["def_char"])[0] if len(frame) else np.zeros(0, dtype=np.int64))
    hashed = (frame["use_start"].to_numpy(dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(61)
    frame["split"] = np.where(hashed % CALIBRATION_SHARE == CALIBRATION_SHARE - 1, "calibration", "eval")
    return frame.drop(columns="def_char")


def select_matched(positions: list[np.ndarray], n: int, modulus: int, *, mean_tolerance: float = MEAN_TOLERANCE,
                   std_tolerance: float = STD_TOLERANCE) -> tuple[list[dict[int, int]], pd.DataFrame]:
    """How many of each residue's available positions to take (``n`` per residue) so that the mean and
    (population) variance of the taken positions agree across residues.

    ``positions[r]``: the available positions of residue ``r`` (repeats allowed). Returns the counts per
    position of each group and a moments frame like `TargetPlacement.moments` (``within_tolerance``: mean
    spread <= ``mean_tolerance`` tokens, std spread <= ``std_tolerance`` of the target std)."""
    n, modulus = check_int("n", n, 1, why=" (positions per residue)"), check_int("modulus", modulus, 1)
    if len(positions) != modulus:
        raise UserInputError(f"positions has {len(positions)} residue groups; modulus={modulus} needs one per residue")
    mean_tolerance, std_tolerance = check_tolerances(mean_tolerance, std_tolerance)
    grids = []
    for r, p in enumerate(positions):
        values, available = np.unique(np.asarray(p, dtype=np.int64), return_counts=True)
        if available.sum() < n:
            raise UserInputError(f"residue {r} has {available.sum()} positions; {n} are needed")
        grids.append((values.astype(np.float64), available))

    def proportional(values: np.ndarray, available: np.ndarray) -> np.ndarray:
        share = available * n / available.sum()
        counts = np.minimum(np.floor(share).astype(np.int64), available)
        for k in np.argsort(-(share - counts), kind="stable")[: n - counts.sum()]:
            counts[k] += 1
        return counts

    def moments(values: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
        mean = float(values @ counts) / n
        return mean, math.sqrt(max(float((values - mean) ** 2 @ counts) / n, 0.0))

    def fit(values: np.ndarray, available: np.ndarray, mu: float, sd: float) -> np.ndarray:
        sd = max(sd, 1.0)  # a one-position group has std 0: scale the std error by a token instead

        def error(a: Any, b: Any) -> Any:  # arrays of candidate sums, or one sum
            mean = a / n
            std = np.sqrt(np.maximum(b / n - mean * mean, 0.0))
            return ((mean - mu) / mean_tolerance) ** 2 + ((std - sd) / (std_tolerance * sd)) ** 2

        counts = proportional(values, available)
        s1, s2 = float(values @ counts), float(values**2 @ counts)
        best = float(error(np.array(s1), np.array(s2)))
        for _ in range(50 * n):
            # every move of one count from a taken position to one with cases left, and every pair of them
            # (a pair fixes the sum of squares in small steps while keeping the sum: single moves stall there)
            take, give = np.flatnonzero(counts > 0), np.flatnonzero(counts < available)
            i, j = (g.ravel() for g in np.meshgrid(take, give, indexing="ij"))
            keep = i != j
            i, j = i[keep], j[keep]
            if len(i) == 0:
                break
            d1, d2 = values[j] - values[i], values[j] ** 2 - values[i] ** 2
            single = error(s1 + d1, s2 + d2)
            a, b = np.meshgrid(np.arange(len(i)), np.arange(len(i)), indexing="ij")
            a, b = a.ravel(), b.ravel()
            # a pair must leave counts in 0..available: the same source twice needs 2 counts, the same target 2 cases
            ok = (a < b) & ((i[a] != i[b]) | (counts[i[a]] >= 2)) & ((j[a] != j[b]) | (available[j[a]] - counts[j[a]] >= 2))
            ok &= (i[a] != j[b]) & (j[a] != i[b])
            a, b = a[ok], b[ok]
            double = error(s1 + d1[a] + d1[b], s2 + d2[a] + d2[b])
            k1 = int(np.argmin(single))
            k2 = int(np.argmin(double)) if len(double) else -1
            if k2 >= 0 and double[k2] < single[k1] - 1e-12:
                moves, value = [a[k2], b[k2]], float(double[k2])
            else:
                moves, value = [k1], float(single[k1])
            if value >= best - 1e-12:
                break
            for m in moves:
                counts[i[m]] -= 1
                counts[j[m]] += 1
                s1, s2 = s1 + d1[m], s2 + d2[m]
            best = value
        return counts

    natural = [moments(v, proportional(v, a)) for v, a in grids]
    scarcest = int(np.argmin([a.sum() for _, a in grids]))
    targets = [(float(np.mean([m for m, _ in natural])), float(np.mean([s for _, s in natural]))), natural[scarcest]]
    best = None
    for mu, sd in targets:
        counts = [fit(v, a, mu, sd) for v, a in grids]
        achieved = np.array([moments(v, c) for (v, _), c in zip(grids, counts)])
        spread = max(np.ptp(achieved[:, 0]) / mean_tolerance, np.ptp(achieved[:, 1]) / (std_tolerance * max(sd, 1.0)))
        if best is None or spread < best[0]:
            best = (spread, counts, achieved, mu, sd)
    spread, counts, achieved, mu, sd = best
    frame = pd.DataFrame({
        "residue": np.arange(modulus),
        "n": n,
        "mean": achieved[:, 0],
        "std": achieved[:, 1],
        "target_mean": mu,
        "target_std": sd,
        "exact": False,
        "within_tolerance": bool(spread <= 1 + 1e-9),
    })
    return [{int(v): int(c) for v, c in zip(values, cnt) if c > 0} for (values, _), cnt in zip(grids, counts)], frame
