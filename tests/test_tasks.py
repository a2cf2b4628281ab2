"""Phase-controlled tasks: vocabulary, moment-matched placement, prompt structure, splits, errors."""

import itertools

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phaseinterp.tasks import (
    DocstringProbe,
    KeyValueRetrieval,
    NeedleRetrieval,
    Vocab,
    exact_matching_possible,
    match_target_moments,
    task_from_dict,
)
from phaseinterp.tasks.placement import MEAN_TOLERANCE, STD_TOLERANCE
from phaseinterp.tasks.splits import mapping_split

# Derandomized, no example database: the same examples on every run.
FAST = settings(max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ helpers
def records_of(task: KeyValueRetrieval, row: torch.Tensor) -> list[tuple[int, int]]:
    """(key id, value id) of every record before <sep>, in prompt order."""
    tokens = row.tolist()
    sep = tokens.index(task.vocab.sep_id)
    keys = set(task.vocab.key_ids)
    return [(tokens[j], tokens[j + 1]) for j in range(1, sep) if tokens[j] in keys]


def check_moments(meta, R: int, n: int, exact: bool) -> None:
    counts = meta.groupby("residue").size()
    assert len(counts) == R and (counts == n).all()
    positions = meta.groupby("residue")["target_pos"]
    means, stds = positions.mean(), positions.std(ddof=0)
    if exact:
        sums = meta.groupby("residue")["target_pos"].sum()
        squares = (meta["target_pos"] ** 2).groupby(meta["residue"]).sum()
        assert sums.nunique() == 1 and squares.nunique() == 1
    assert means.max() - means.min() <= MEAN_TOLERANCE + 1e-9
    assert (stds.max() - stds.min()) / stds.mean() <= STD_TOLERANCE * 1.01


# -------------------------------------------------------------------- vocab
def test_vocab_default_fits_128_and_round_trips():
    vocab = Vocab.default()
    assert vocab.size <= 128 and len(vocab.keys) == 48 and len(vocab.values) == 48
    assert len(set(vocab.tokens)) == vocab.size
    words = ["<bos>", "cat", "Ada", "<sep>", "cat"]
    ids = vocab.encode(words)
    assert vocab.decode(ids) == " ".join(words)
    assert vocab.encode("<bos> cat Ada") == ids[:3]  # a Vocab is a word-level tokenizer
    assert Vocab.from_dict(vocab.to_dict()) == vocab
    assert set(vocab.key_ids).isdisjoint(vocab.value_ids) and set(vocab.filler_ids).isdisjoint(vocab.key_ids)


def test_vocab_build_combines_words_and_rejects_bad_input():
    big = Vocab.build(n_keys=100, n_values=60, n_fillers=4)
    assert len(big.keys) == 100 and len(set(big.keys)) == 100 and "red-cat" in big.keys
    with pytest.raises(KeyError, match="'zebra' is not in"):
        Vocab.default().encode(["zebra"])
    with pytest.raises(ValueError, match="out of range"):
        Vocab.default().decode([500])
    with pytest.raises(ValueError, match="duplicated"):
        Vocab(keys=("cat", "cat"))


# ----------------------------------------------------------- moment matching
@pytest.mark.parametrize("R", [2, 3, 4])
def test_exact_matching_needs_multiples_of_R_squared_brute_force(R):
    """Enumerate every multiset: groups share (sum, sum of squares) iff n is a multiple of R^2."""

    def achievable(points, n):
        return {(sum(c), sum(p * p for p in c)) for c in itertools.combinations_with_replacement(points, n)}

    positions = range(0, 4 * R)
    for n in range(1, R * R + 1):
        groups = [achievable([p for p in positions if p % R == r], n) for r in range(R)]
        possible = bool(set.intersection(*groups))
        assert possible == exact_matching_possible(n, R), (R, n)


@pytest.mark.parametrize("n", [576, 1152])
def test_exact_matching_for_multiples_of_576(n):
    placement = match_target_moments(1, 93, 24, n)
    assert placement.exact
    assert len(set(placement.positions.sum(1))) == 1
    assert len(set((placement.positions.astype(np.int64) ** 2).sum(1))) == 1


@FAST
@given(
    R=st.sampled_from([4, 6, 8, 12, 24]),
    lo=st.integers(0, 50),
    width=st.integers(40, 260),
    n=st.integers(60, 400),
)
def test_placement_properties(R, lo, width, n):
    hi = lo + width - 1
    try:
        placement = match_target_moments(lo, hi, R, n)
    except ValueError as err:
        assert "n_per_residue" in str(err) or "too few" in str(err) or "cannot realize" in str(err)
        return
    pos = placement.positions
    assert pos.shape == (R, n)
    assert (pos % R == np.arange(R)[:, None]).all()
    assert pos.min() >= lo and pos.max() <= hi
    assert placement.mean_spread <= MEAN_TOLERANCE + 1e-9
    assert placement.std_spread <= STD_TOLERANCE + 1e-12
    assert placement.exact == exact_matching_possible(n, R) or not exact_matching_possible(n, R)


@pytest.mark.parametrize("R", [4, 8, 12])
def test_placement_exact_when_size_allows(R):
    placement = match_target_moments(10, 10 + 8 * R, R, R * R)
    assert placement.exact and placement.mean_spread == 0 and placement.std_spread == 0


def test_placement_default_sizes_succeed_and_small_ones_explain():
    lo, hi = KeyValueRetrieval().target_range
    for n in (72, 100, 250, 256, 576, 1000):
        assert match_target_moments(lo, hi, 24, n).within_tolerance
    with pytest.raises(ValueError, match=r"n_per_residue=8 cannot match .* smallest workable n_per_residue above 8 is about 72"):
        match_target_moments(lo, hi, 24, 8)
    rough = match_target_moments(lo, hi, 24, 8, strict=False)
    assert rough.positions.shape == (24, 8) and not rough.within_tolerance


# --------------------------------------------------------- key-value prompts
def check_prompts(task: KeyValueRetrieval, batch, R: int, n: int) -> None:
    T, q = task.seq_len, task.query_pos
    meta, tokens = batch.meta, batch.tokens
    assert tokens.shape == (R * n, T) and (batch.answer_pos == q).all()
    check_moments(meta, R, n, exact_matching_possible(n, R))
    assert (meta["target_pos"] % R == meta["residue"]).all()
    lo_d, hi_d = task.min_distance, task.max_distance or T - 2
    assert meta["distance"].between(lo_d, hi_d).all()
    rows = torch.arange(len(tokens))
    pos = torch.tensor(meta["target_pos"].to_numpy())
    assert (tokens[rows, pos] == tokens[:, q]).all()  # the query is the target's key
    assert (tokens[rows, pos + 1] == batch.answer).all()  # ... and the answer its value
    sep_at = T - 2 * task.n_demos - 2
    assert (tokens[:, sep_at] == task.vocab.sep_id).all()
    for i in range(0, len(tokens), max(1, len(tokens) // 40)):
        recs = records_of(task, tokens[i])
        keys, values = [k for k, _ in recs], [v for _, v in recs]
        assert len(recs) == task.n_records and len(set(keys)) == len(keys) and len(set(values)) == len(values)
        mapping = dict(recs)
        demos = tokens[i, sep_at + 1 : q].view(-1, 2).tolist()
        assert all(mapping[k] == v for k, v in demos)
        assert int(tokens[i, q]) not in [k for k, _ in demos]
        assert (tokens[i, :q] == tokens[i, q]).sum() == 1  # the target key occurs once before the query


@FAST
@given(
    padding=st.sampled_from(["prefix", "in_sequence"]),
    R=st.sampled_from([4, 6, 8, 12]),
    seq_len=st.integers(96, 200),
    n_records=st.integers(6, 36),
    n_demos=st.integers(0, 2),
    min_distance=st.integers(3, 40),
    exact=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_generate_properties(padding, R, seq_len, n_records, n_demos, min_distance, exact, seed):
    n = R * R if exact else 100
    try:
        task = KeyValueRetrieval(
            seq_len=seq_len, n_records=n_records, n_demos=n_demos, residue_modulus=R,
            min_distance=min_distance, padding=padding,
        )
        batch = task.generate(n, seed=seed)
    except ValueError as err:
        assert any(word in str(err) for word in ("seq_len", "n_per_residue", "min_distance", "n_demos"))
        return
    check_prompts(task, batch, R, n)


@pytest.mark.parametrize("padding", ["prefix", "in_sequence"])
def test_default_task_24_residues(padding):
    task = KeyValueRetrieval(padding=padding)
    batch = task.generate(100, seed=3, stride=4)
    check_prompts(task, batch, 24, 100)
    assert (batch.meta["phase"] == batch.meta["target_pos"] % 4).all()
    moments = batch.moments
    assert set(moments.columns) >= {"residue", "n", "mean", "std", "target_mean", "target_std", "exact"}
    assert np.allclose(moments["mean"], batch.meta.groupby("residue")["target_pos"].mean())


def test_padding_strategies_differ_in_how_distractors_move():
    prefix = KeyValueRetrieval(padding="prefix").generate(100, seed=0)
    spread = KeyValueRetrieval(padding="in_sequence").generate(100, seed=0)
    # prefix: records contiguous, so the target sits an even offset 2i after the first record
    offset = prefix.meta["target_pos"] - prefix.meta["first_record_pos"]
    assert (offset == 2 * prefix.meta["target_index"]).all()
    fillers = torch.tensor(KeyValueRetrieval().vocab.filler_ids)
    for row, first in zip(prefix.tokens[:50], prefix.meta["first_record_pos"][:50]):
        assert not torch.isin(row[first : first + 2 * 40], fillers).any()
    # in_sequence: fillers sit between records, the offset is not tied to the record index
    offset = spread.meta["target_pos"] - spread.meta["first_record_pos"]
    assert (offset != 2 * spread.meta["target_index"]).mean() > 0.5


def test_generate_is_deterministic_and_seeded():
    task = KeyValueRetrieval()
    a, b, c = task.generate(80, seed=1), task.generate(80, seed=1), task.generate(80, seed=2)
    assert torch.equal(a.tokens, b.tokens) and a.meta.equals(b.meta)
    assert not torch.equal(a.tokens, c.tokens)


def test_calibration_mappings_are_disjoint_from_evaluation():
    task = KeyValueRetrieval()
    key_index = {k: i for i, k in enumerate(task.vocab.key_ids)}
    value_index = {v: i for i, v in enumerate(task.vocab.value_ids)}

    def mappings(batch):
        out = set()
        for row in batch.tokens:
            recs = records_of(task, row)
            out.add(frozenset(recs))
            keys = np.array([key_index[k] for k, _ in recs])
            values = np.array([value_index[v] for _, v in recs])
            yield mapping_split(keys, values, len(key_index), len(value_index))
        return out

    evaluation = [task.generate(72, seed=s) for s in (0, 1)]
    calibration = [task.calibration(500, seed=s) for s in (0, 1)]
    assert all(bit == 0 for b in evaluation for bit in mappings(b))
    assert all(bit == 1 for b in calibration for bit in mappings(b))
    sets_eval = {frozenset(records_of(task, row)) for b in evaluation for row in b.tokens}
    sets_cal = {frozenset(records_of(task, row)) for b in calibration for row in b.tokens}
    assert sets_eval.isdisjoint(sets_cal)
    cal = calibration[0]
    assert (cal.meta["split"] == "calibration").all() and cal.meta["residue"].nunique() == 24
    assert (cal.tokens[torch.arange(len(cal)), torch.tensor(cal.meta["target_pos"].to_numpy()) + 1] == cal.answer).all()


def test_shared_mappings_for_cluster_bootstrap():
    task = KeyValueRetrieval()
    fresh = task.generate(72, seed=0)
    assert len({frozenset(records_of(task, row)) for row in fresh.tokens[:500]}) == 500  # random per prompt
    batch = task.generate(72, seed=0, n_mappings=30)
    assert batch.meta["mapping_id"].nunique() == 30
    for _, group in batch.meta.groupby("mapping_id"):
        sets = {frozenset(records_of(task, batch.tokens[i])) for i in group.index[:5]}
        assert len(sets) == 1


def test_sample_train_masks_and_knobs():
    task = KeyValueRetrieval()
    batch = task.sample_train(16, 0, n_records=(4, 24))
    assert batch.tokens.shape == (16, 128) and batch.n_records.min() >= 4 and batch.n_records.max() <= 24
    assert torch.equal(batch.targets[:, :-1], batch.tokens[:, 1:])
    assert not batch.answer_mask[:, -1].any() and (batch.answer_mask & ~batch.value_mask).sum() == 0
    values = torch.tensor(task.vocab.value_ids)
    assert torch.isin(batch.targets[batch.value_mask], values).all()
    for b in range(16):
        mapping = dict(records_of(task, batch.tokens[b]))
        assert len(mapping) == batch.n_records[b]
        for t in torch.nonzero(batch.answer_mask[b]).flatten().tolist():
            assert mapping[int(batch.tokens[b, t])] == int(batch.targets[b, t])
    fixed = task.sample_train(4, 1, n_records=10, n_queries=5, query_distance=(3, 12))
    assert (fixed.answer_mask.sum(1) == 5).all()
    again = task.sample_train(4, 1, n_records=10, n_queries=5, query_distance=(3, 12))
    assert torch.equal(fixed.tokens, again.tokens)
    with pytest.raises(ValueError, match="query_distance"):
        task.sample_train(4, 0, query_distance=(2, 2))


def test_task_serialization_round_trip():
    task = KeyValueRetrieval(seq_len=160, n_records=30, padding="prefix", vocab=Vocab.build(n_keys=40, n_values=40))
    assert task_from_dict(task.to_dict()) == task
    needle = NeedleRetrieval(seq_len=512)
    assert task_from_dict(needle.to_dict()) == needle
    with pytest.raises(ValueError, match="unknown KeyValueRetrieval fields"):
        KeyValueRetrieval.from_dict({"kind": "KeyValueRetrieval", "n_recs": 3})


def test_bad_requests_raise_clear_errors():
    with pytest.raises(ValueError, match=r"seq_len=60 is too short"):
        KeyValueRetrieval(seq_len=60)
    with pytest.raises(ValueError, match=r"seq_len=100 is too short to realize every residue mod 24"):
        KeyValueRetrieval(seq_len=100)
    with pytest.raises(ValueError, match=r"n_records=60 is out of range \(valid: 2..48\)"):
        KeyValueRetrieval(n_records=60)
    with pytest.raises(ValueError, match=r"n_demos=30 is out of range"):
        KeyValueRetrieval(n_demos=30)
    with pytest.raises(ValueError, match="padding='middle'"):
        KeyValueRetrieval(padding="middle")
    with pytest.raises(ValueError, match=r"R=24 is not a multiple of stride=5"):
        KeyValueRetrieval().generate(100, stride=5)
    with pytest.raises(ValueError, match="n_per_residue=10 cannot match"):
        KeyValueRetrieval().generate(10)
    smoke = KeyValueRetrieval().generate(4, strict=False)
    assert len(smoke) == 96 and not smoke.moments["within_tolerance"].all()


# ---------------------------------------------------------------- needle
class WordTokenizer:
    """A whitespace tokenizer over a fixed word list (stands in for a real tokenizer)."""

    def __init__(self, words):
        self.words = ["<s>"] + list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.bos_token_id = 0

    def encode(self, text):
        return [self.index[w] for w in text.split()]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


@pytest.mark.parametrize("padding", ["prefix", "in_sequence"])
def test_needle_structure_and_moments(padding):
    task = NeedleRetrieval(seq_len=512, padding=padding)
    batch = task.generate(72, seed=0, stride=4)
    meta, tokens = batch.meta, batch.tokens
    check_moments(meta, 24, 72, False)
    assert batch.answer_tokens.shape == (len(batch), 2) and torch.equal(batch.answer, batch.answer_tokens[:, 0])
    rows = torch.arange(len(batch))
    pos = torch.tensor(meta["target_pos"].to_numpy())
    for k in range(2):
        assert (tokens[rows, pos + k] == tokens[:, -2 + k]).all()  # the target key ends the prompt
        assert (tokens[rows, pos + 2 + k] == batch.answer_tokens[:, k]).all()
    middle = task.seq_len // 2
    assert meta["target_pos"].between(middle - 60, middle + 60).all()
    part = task.generate(72, seed=0, residues=[5, 6])
    assert torch.equal(part.tokens, tokens[5 * 72 : 7 * 72])


def test_needle_with_a_tokenizer_and_errors():
    vocab = Vocab.default()
    tok = WordTokenizer(vocab.keys + vocab.values + vocab.fillers + ("|",))
    task = NeedleRetrieval(seq_len=600, separator="|")
    batch = task.generate(72, seed=1, tokenizer=tok)
    assert (batch.tokens[:, 0] == 0).all() and int(batch.tokens.max()) < len(tok.words)
    assert tok.decode(batch.tokens[0, -2:].tolist()).split()[0] in vocab.keys
    cal = task.calibration(24, seed=0, tokenizer=tok)
    assert (cal.meta["split"] == "calibration").all()
    with pytest.raises(ValueError, match=r"n_records=4077 is out of range"):
        NeedleRetrieval(seq_len=16384)
    with pytest.raises(ValueError, match="widen target_window"):
        NeedleRetrieval(seq_len=512, target_window=30)


# -------------------------------------------------------------- docstring
class LengthOracle(torch.nn.Module):
    """Test fixture: prefers the right value unless the docstring length is 3 mod 4."""

    def __init__(self, vocab, right, wrong, base_len):
        super().__init__()
        self.vocab, self.right, self.wrong, self.base_len = vocab, right, wrong, base_len
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, self.vocab.size)
        for b, row in enumerate(tokens):
            n = int((row != self.vocab.pad_id).sum()) - 1  # the candidate is one token
            length = n - self.base_len
            winner = self.wrong if length % 4 == 3 else self.right
            logits[b, :, winner] = 3.0
        return logits


def test_docstring_probe_changes_only_the_docstring(tmp_path):
    vocab = Vocab.default()
    probe = DocstringProbe.synthetic(vocab)
    frame, prompts, right, wrong = probe.build(vocab)
    assert len(frame) == 3 * 16
    for _family, group in frame.groupby("family"):
        ids = [prompts[i] for i in group.index]
        lengths = [len(p) for p in ids]
        assert np.diff(lengths).tolist() == [1] * 15
        start = int(group["docstring_start"].iloc[0])
        for p, L in zip(ids, group["length"]):
            assert p[:start] == ids[0][:start] and p[start + L :] == ids[0][start + 24 :]
    base_len = len(prompts[0]) - 24
    model = LengthOracle(vocab, right[0], wrong[0], base_len)
    result = probe.run(model, vocab)
    per_length = result.by_length()
    expected = [(L % 4) != 3 for L in range(24, 40)]
    assert per_length["right_first"].tolist() == [float(e) for e in expected]
    path = result.save(tmp_path / "doc.json")
    again = type(result).load(path)
    pd.testing.assert_frame_equal(again.to_frame(), result.to_frame())
    with pytest.raises(ValueError, match="exactly once"):
        DocstringProbe(template="no placeholder")
