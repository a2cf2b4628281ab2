"""IdentifierRecall: an identifier's next token at its use, scored by the phase of its definition."""

import json
import random

import numpy as np
import pytest

from phaseinterp.errors import UserInputError
from phaseinterp.tasks import IdentifierRecall, task_from_dict
from phaseinterp.tasks.identifier import definitions, select_matched

WORDS = ("alpha beta gamma delta omega sigma kappa theta north south east west river stone cloud amber cedar "
         "maple piano violin tiger zebra lemon mango").split()
FILLER = ("print(1)", "pass", "print('ok')", "x = 0", "count += 1", "assert True")


def synthetic_code(seed: int, n_functions: int) -> list[str]:
    """Python modules of small functions: multi-word parameters and locals defined, then used after a
    random number of filler lines (so definitions sit at many distances before their use)."""
    rng = random.Random(seed)
    modules, lines = [], []
    for f in range(n_functions):
        name = lambda k: "_".join(rng.sample(WORDS, k))  # noqa: E731
        fn, first, second, local = name(2), name(3), name(3), name(3)
        lines.append(f"def {fn}({first}, {second}=None):")
        lines.append(f"    {local} = {first} + 1")
        lines += ["    " + rng.choice(FILLER) for _ in range(rng.randint(0, 40))]
        lines.append(f"    return {local} * {second}")
        lines.append("")
        if f % 20 == 19:
            modules.append("\n".join(lines))
            lines = []
    return modules


@pytest.fixture(scope="module")
def code(tmp_path_factory):
    from phaseinterp.train.tokenizer import TextTokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("code")
    modules = synthetic_code(0, 400)
    (root / "code.jsonl").write_text("".join(json.dumps({"text": m}) + "\n" for m in modules))
    tok = TextTokenizer(train_tokenizer(root / "code.jsonl", 400, root / "tok", progress=False))
    ids = np.concatenate([np.array(tok.encode(m) + [tok.eos_id]) for m in modules]).astype(np.uint32)
    return tok, ids


def small(code, **changes) -> IdentifierRecall:
    tok, ids = code
    settings = dict(seq_len=128, residue_modulus=8, min_distance=16, max_distance=111)
    return IdentifierRecall.from_tokenizer(tok, ids, **{**settings, **changes})


def test_definitions_are_found_by_kind():
    text = ("def fetch_rows(db_conn, limit: Dict[str, int] = None, *extra_args, **more_kw):\n"
            "    row_count = 0\n    total: int = 1\n    for each_row in rows:\n        pass\n"
            "class TableView(Base):\n    import numpy as np_alias\n    if row_count == 2:\n        pass\n")
    found = {(name, kind) for _, name, kind in definitions(text)}
    assert found == {("fetch_rows", "def"), ("db_conn", "param"), ("limit", "param"), ("extra_args", "param"),
                     ("more_kw", "param"), ("row_count", "assign"), ("total", "assign"), ("each_row", "for"),
                     ("TableView", "class"), ("np_alias", "as")}  # not `int` (an annotation), not `row_count ==`


def test_every_prompt_ends_inside_a_use_whose_only_earlier_occurrence_is_the_definition(code):
    tok, _ = code
    task = small(code)
    n = task.capacity()
    assert n >= 8, task.availability()
    batch = task.generate(n, seed=0, stride=4)
    T = task.seq_len
    assert batch.tokens.shape == (8 * n, T) and (batch.answer_pos == T - 1).all()
    for row, meta in zip(batch.tokens.numpy(), batch.meta.itertuples()):
        p, i = meta.target_pos, meta.answer_index
        assert row[p] == meta.answer and meta.distance == T - 1 - p and meta.phase == p % 4  # the source
        assert 16 <= meta.distance <= 111
        # the prompt ends with the use's first i tokens; the definition's first i tokens precede the source
        use = tok.decode(row[T - i :].tolist()).lstrip(" ")
        assert meta.name.startswith(use) and tok.decode(row[p - i : p + 1].tolist()).lstrip(" ") == \
            meta.name[: len(tok.decode(row[p - i : p + 1].tolist()).lstrip(" "))]
        text = tok.decode(row[: T - i].tolist())
        assert len([m for m in _words(text) if m == meta.name]) == 1, (meta.name, text)


def _words(text: str) -> list[str]:
    import re

    return re.findall(r"(?<![\w])[A-Za-z_]\w*", text)


def test_residues_are_balanced_by_selection_with_matched_moments(code):
    task = small(code)
    n = task.capacity()
    batch = task.generate(n, seed=0)
    assert (batch.meta.groupby("residue").size() == n).all()
    stats = batch.meta.groupby("residue").target_pos.agg(["mean", lambda x: x.std(ddof=0)])
    assert stats["mean"].max() - stats["mean"].min() <= 0.5
    assert (stats.iloc[:, 1].max() - stats.iloc[:, 1].min()) / stats.iloc[:, 1].mean() <= 0.01
    assert batch.moments["within_tolerance"].all()
    available = task.availability()
    assert list(available.residue) == list(range(8)) and (available.cases >= n).all()
    with pytest.raises(UserInputError, match=f"n_per_residue={available.cases.min() + 1} is more than"):
        task.generate(int(available.cases.min()) + 1)


def test_select_matched_meets_the_moments_it_reports():
    rng = np.random.default_rng(0)
    positions = [r + 8 * rng.integers(2, 14, size=rng.integers(60, 90)) for r in range(8)]
    counts, moments = select_matched(positions, 40, 8)
    for r, chosen in enumerate(counts):
        taken = np.repeat(list(chosen), list(chosen.values()))
        assert len(taken) == 40 and (taken % 8 == r).all()
        assert all(c <= (positions[r] == p).sum() for p, c in chosen.items())  # never more than there are
        assert np.isclose(taken.mean(), moments["mean"][r]) and np.isclose(taken.std(), moments["std"][r])
    assert moments["within_tolerance"].all() and np.ptp(moments["mean"]) <= 0.5


def test_generation_is_deterministic_and_the_control_changes_only_the_definition(code):
    task = small(code)
    n = task.capacity() - 2
    a, b = task.generate(n, seed=1), task.generate(n, seed=1)
    assert np.array_equal(a.tokens, b.tokens) and a.meta.equals(b.meta)
    assert not np.array_equal(a.tokens, task.generate(n, seed=2).tokens)
    control = IdentifierRecall.from_dict({**task.to_dict(), "control": True}).generate(n, seed=1)
    assert np.array_equal(control.answer, a.answer) and control.meta.target_pos.equals(a.meta.target_pos)
    changed = (control.tokens != a.tokens).numpy()
    for row, diff, meta in zip(control.tokens.numpy(), changed, a.meta.itertuples()):
        first = meta.target_pos - meta.answer_index
        assert diff[first : first + meta.n_tokens].any() and not diff[:first].any()
        assert not diff[first + meta.n_tokens :].any()
        assert meta.answer not in row[first : first + meta.n_tokens]
    calib = task.calibration(30, seed=0)
    assert (calib.meta.split == "calibration").all()
    eval_uses = set(zip(a.meta.window_start, a.meta.answer_index))
    assert not eval_uses & set(zip(calib.meta.window_start, calib.meta.answer_index))


def test_round_trip(code):
    task = small(code)
    again = IdentifierRecall.from_dict(json.loads(json.dumps(task.to_dict())))
    assert again == task and task_from_dict(task.to_dict()) == task
    assert "token_text" in repr(task)


def test_bad_inputs_are_refused(code):
    tok, ids = code
    with pytest.raises(UserInputError, match="text has 100 tokens"):
        IdentifierRecall.from_tokenizer(tok, ids[:100], seq_len=128, max_distance=111)
    with pytest.raises(UserInputError, match="sources='all'"):
        small(code, sources="all")
    with pytest.raises(UserInputError, match="max_distance=200"):
        small(code, max_distance=200)
    with pytest.raises(UserInputError, match="leaves 11 source positions"):
        small(code, min_distance=100, max_distance=110)
    with pytest.raises(UserInputError, match="outside 0..9"):
        IdentifierRecall(seq_len=128, residue_modulus=8, min_distance=16, max_distance=111, text=tuple(int(t) for t in ids[:500]),
                         token_text=tuple("abcdefghij"))
    with pytest.raises(UserInputError, match="n_per_residue=0"):
        small(code).generate(0)
