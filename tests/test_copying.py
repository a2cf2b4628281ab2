"""SpanCopy: a random span set into text and repeated; scored by the phase of the copied token's source."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from phaseinterp.errors import UserInputError
from phaseinterp.tasks import SpanCopy, resolve_task, task_from_dict

POOL = tuple(range(100, 400))  # span tokens: disjoint from the filler's ids, so a copy has one source
TEXT = tuple(int(t) for t in np.random.default_rng(7).integers(1, 100, size=6000))


def small(**changes) -> SpanCopy:
    settings = dict(seq_len=128, span_tokens=6, prefix_tokens=3, min_gap=16, residue_modulus=8, token_ids=POOL,
                    filler_text=TEXT)
    return SpanCopy(**{**settings, **changes})


class Copier(torch.nn.Module):
    """Predicts, at every position, the token that followed the previous occurrence of the last ``j``
    tokens (an ideal induction head); ``blind`` phases mod 4 of that source get a wrong answer."""

    def __init__(self, j: int, d_vocab: int, n_ctx: int, blind: tuple[int, ...] = ()):
        super().__init__()
        self.j, self.blind = j, blind
        self.cfg = SimpleNamespace(d_vocab=d_vocab, n_ctx=n_ctx, stride=4, label="copier")

    def forward(self, tokens):
        batch, T = tokens.shape
        logits = torch.zeros(batch, T, self.cfg.d_vocab)
        for b, row in enumerate(tokens.tolist()):
            suffix = row[T - self.j :]
            source = next(p for p in range(T - self.j - 1, self.j - 1, -1) if row[p - self.j : p] == suffix)
            logits[b, T - 1, row[source] if source % 4 not in self.blind else 0] = 1.0
        return logits


def test_prompts_hold_the_span_twice_in_contiguous_text():
    task = small()
    batch = task.generate(16, seed=0, stride=4)
    T, k, j = task.seq_len, task.span_tokens, task.prefix_tokens
    assert batch.tokens.shape == (8 * 16, T) and (batch.answer_pos == T - 1).all()
    text = np.asarray(TEXT)
    for row, answer_rest, meta in zip(batch.tokens.numpy(), batch.answer_tokens.numpy(), batch.meta.itertuples()):
        s, p = meta.span_start, meta.target_pos
        assert p == s + j and meta.residue == p % 8 and meta.phase == p % 4 and meta.distance == T - 1 - p
        span = row[s : s + k]
        assert len(set(span)) == k and set(span) <= set(POOL)  # distinct pool tokens
        assert np.array_equal(row[T - j :], span[:j])  # the prompt ends with the span's first j tokens
        assert row[p] == meta.answer == answer_rest[0] and np.array_equal(answer_rest, span[j:])
        assert T - j - (s + k) >= task.min_gap
        filler = np.concatenate([row[:s], row[s + k : T - j]])  # the text around the span is one stretch
        assert np.array_equal(filler, text[meta.filler_offset : meta.filler_offset + len(filler)])


def test_residues_are_balanced_and_moments_matched():
    task = small()
    batch = task.generate(64, seed=3)
    counts = batch.meta.groupby("residue").size()
    assert list(counts.index) == list(range(8)) and (counts == 64).all()
    stats = batch.meta.groupby("residue").target_pos.agg(["mean", "std"])
    population = batch.meta.groupby("residue").target_pos.std(ddof=0)
    assert stats["mean"].max() - stats["mean"].min() <= 0.5
    assert (population.max() - population.min()) / population.mean() <= 0.01
    assert np.allclose(batch.moments["mean"], stats["mean"])
    lo, hi = task.band()
    assert batch.meta.target_pos.between(lo, hi).all()
    # the paper's 24 residues at the training length: 400 per residue is 2,400 per phase of S = 4
    full = SpanCopy(token_ids=POOL, filler_text=TEXT * 2)
    assert full.placement(400).within_tolerance


def test_generation_is_deterministic_and_groups_are_seeded_separately():
    task = small()
    a, b = task.generate(16, seed=1), task.generate(16, seed=1)
    assert torch.equal(a.tokens, b.tokens) and a.meta.equals(b.meta)
    assert not torch.equal(a.tokens, task.generate(16, seed=2).tokens)
    three = task.generate(16, seed=1, residues=[3])
    assert torch.equal(three.tokens, a.tokens[a.meta.residue.to_numpy() == 3])
    calib = task.calibration(40, seed=1)
    assert (calib.meta.split == "calibration").all() and sorted(set(calib.meta.residue)) == list(range(8))
    assert not any((calib.tokens[:, None] == a.tokens[None]).all(-1).any(-1))


def test_an_ideal_copier_scores_every_prompt_and_a_phase_blind_one_shows_its_phase():
    from phaseinterp import phase_profile

    task = small()
    batch = task.generate(24, seed=0)
    perfect = phase_profile(Copier(task.prefix_tokens, 400, 128), batch, progress=False)
    assert perfect.mean == 1.0 and perfect.phase_gap == 0.0
    blind = phase_profile(Copier(task.prefix_tokens, 400, 128, blind=(3,)), batch, progress=False)
    assert list(blind.phase_accuracy) == [1.0, 1.0, 1.0, 0.0] and blind.worst_phases == (3,)
    # the phase scored is the source's (the answer's earlier occurrence), prompt by prompt
    assert (blind.records["correct"] == (blind.records["target_pos"] % 4 != 3)).all()


def test_round_trip_and_stored_task():
    task = small()
    assert SpanCopy.from_dict(json.loads(json.dumps(task.to_dict()))) == task
    assert task_from_dict(task.to_dict()) == task

    class Stored:
        metadata = {"task": task.to_dict(), "task_type": "SpanCopy"}

    assert resolve_task(Stored()) == task
    assert "token_ids" in repr(task) and "300 items" in repr(task)


def test_from_tokenizer_takes_the_tokens_the_text_holds_but_special_ones():
    tokenizer = SimpleNamespace(eos_id=0, bos_token_id=None)
    heldout = np.concatenate([[0], np.arange(1, 200), [0], np.arange(1, 2000) % 150]).astype(np.uint32)
    task = SpanCopy.from_tokenizer(tokenizer, heldout, seq_len=128, residue_modulus=8, filler_tokens=1000)
    assert task.token_ids == tuple(range(1, 200)) and len(task.filler_text) == 1000
    with pytest.raises(UserInputError, match="held-out text has 100 tokens"):
        SpanCopy.from_tokenizer(tokenizer, heldout[:100], seq_len=128)


@pytest.mark.parametrize("changes, message", [
    (dict(filler_text=TEXT[:100]), "filler_text has 100 tokens; it must be longer than seq_len=128"),
    (dict(token_ids=tuple(range(10))), "token_ids holds 10 distinct tokens"),
    (dict(prefix_tokens=6), r"prefix_tokens=6 .*1\.\.5"),
    (dict(span_tokens=1), "span_tokens=1"),
    (dict(span_tokens=100), "the source band"),
    (dict(min_gap=120), "the source band"),
    (dict(target_window=5), "the source band"),
    (dict(residue_modulus=0), "residue_modulus=0"),
])
def test_bad_settings_are_refused(changes, message):
    with pytest.raises(UserInputError, match=message):
        small(**changes)


def test_bad_requests_are_refused():
    task = small()
    with pytest.raises(UserInputError, match="n_per_residue=0"):
        task.generate(0)
    with pytest.raises(UserInputError, match="residue=8"):
        task.generate(16, residues=[8])
    with pytest.raises(UserInputError):
        task.generate(16, stride=3)  # 8 residues do not fold by 3
    with pytest.raises(UserInputError, match="n_per_residue=3 cannot match"):
        task.generate(3)


def test_experiments_run_on_the_task():
    """The task plugs into every experiment as the other tasks do (here a random tiny model)."""
    import phaseinterp as pi
    from phaseinterp.config import preset
    from phaseinterp.models import CompressedTransformer

    model = CompressedTransformer(preset("tiny", d_vocab=512, n_ctx=128)).eval()
    task = small()
    assert pi.phase_profile(model, task, n_per_residue=16, progress=False).residue_n.tolist() == [16] * 8
    assert pi.ablate(model, task, n_per_residue=16, layer=0).to_frame() is not None
    assert pi.gate_cycling_profile(model, task, shifts=[1], n_per_residue=16) is not None
