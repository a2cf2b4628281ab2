"""Docstring-length probe: a fixed code template whose only change is a decorative docstring's length."""

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from phaseinterp._checks import check_device, check_int, listed
from phaseinterp.errors import UserInputError
from phaseinterp.models.protocol import eval_mode
from phaseinterp.results import Result, plotting, settings_repr, settings_repr_html
from phaseinterp.tasks.needle import encode_piece
from phaseinterp.tasks.vocab import Tokenizer, Vocab

CODE_TEMPLATE = '''"""{docstring}"""


class Inventory:
    def __init__(self):
        self.apples = 0
        self.pears = 0

    def add_apples(self, count):
        self.'''

CODE_FAMILIES: dict[str, str] = {
    "lorem": "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore "
    "et dolore magna aliqua.",
    "prose": "This module keeps track of the fruit in stock and is kept for compatibility with older callers. ",
    "dashes": "- - - - - - - - - - - - - - - - ",
    "numbers": "0 1 2 3 4 5 6 7 8 9 ",
}


@dataclass(frozen=True)
class DocstringProbe:
    """Rank two continuations of a fixed template while only the docstring's length changes.

    ``template`` contains ``{docstring}`` once. Per filler family and length ``L`` in ``lengths`` the
    prompt is ``[bos] encode(before) + doc[:L] + encode(after)`` (``doc``: the family's text encoded and
    repeated), so everything after the docstring shifts by ``L``. Score: the summed log-probability of
    ``right`` vs ``wrong`` (teacher forced); ``right_first`` when right ranks higher.
    ``DocstringProbe.synthetic(vocab)`` is a retrieval-shaped template over the synthetic vocabulary."""

    template: str = CODE_TEMPLATE
    right: str = "apples"
    wrong: str = "pears"
    lengths: tuple[int, ...] = tuple(range(24, 40))
    families: dict[str, str] = field(default_factory=lambda: dict(CODE_FAMILIES))
    add_bos: bool = True

    def __repr__(self) -> str:  # a settings table: never the whole vocabulary
        return settings_repr(self)

    def _repr_html_(self) -> str:
        return settings_repr_html(self)

    def __post_init__(self) -> None:
        if self.template.count("{docstring}") != 1:
            raise UserInputError(f"template must contain '{{docstring}}' exactly once (found {self.template.count('{docstring}')})")
        lengths = listed(self.lengths)
        if not isinstance(lengths, list) or not lengths:
            raise UserInputError(f"lengths={self.lengths!r} must be a non-empty set of integers >= 0")
        object.__setattr__(self, "lengths", tuple(check_int("lengths", n, 0, why=" (docstring tokens)")
                                                  for n in lengths))
        if not self.families:
            raise UserInputError("families must name at least one filler text")
        if self.right == self.wrong:
            raise UserInputError(f"right={self.right!r} and wrong={self.wrong!r} must differ")

    @classmethod
    def synthetic(cls, vocab: Vocab | None = None, lengths: tuple[int, ...] = tuple(range(24, 40))) -> "DocstringProbe":
        """Synthetic-vocabulary version: ``<bos> doc k1 v1 .. k6 v6 <sep> k2`` -> ``v2`` (right) vs ``v5``."""
        vocab = vocab or Vocab.default()
        if len(vocab.keys) < 6 or len(vocab.values) < 6:
            raise UserInputError("the synthetic docstring probe needs a vocabulary with >= 6 keys and values")
        records = " ".join(f"{k} {v}" for k, v in zip(vocab.keys[:6], vocab.values[:6]))
        fillers = vocab.fillers
        families = {"cycle": " ".join(fillers[:4]), "repeat": fillers[0], "mixed": " ".join(reversed(fillers))}
        return cls(template=f"{{docstring}} {records} <sep> {vocab.keys[1]}", right=vocab.values[1],
                   wrong=vocab.values[4], lengths=lengths, families=families)

    def build(self, tokenizer: Tokenizer) -> tuple[pd.DataFrame, list[list[int]], list[int], list[int]]:
        """Per-prompt table (family, length, n_tokens, docstring_start, answer_pos), prompt ids, right ids, wrong ids."""
        before, after = self.template.split("{docstring}")
        head = [int(tokenizer.bos_token_id)] if self.add_bos and getattr(tokenizer, "bos_token_id", None) is not None else []
        before_ids = encode_piece(tokenizer, before) if before.strip() else []
        after_ids = encode_piece(tokenizer, after) if after.strip() else []
        right, wrong = encode_piece(tokenizer, self.right), encode_piece(tokenizer, self.wrong)
        if not right or not wrong or right == wrong:
            raise UserInputError(f"right={self.right!r} -> {right} and wrong={self.wrong!r} -> {wrong} must encode to different, non-empty ids")
        rows, prompts = [], []
        for family, text in self.families.items():
            stream = encode_piece(tokenizer, text)
            if not stream:
                raise UserInputError(f"filler family {family!r} encodes to no tokens")
            repeats = -(-max(self.lengths) // len(stream))
            doc = (stream * max(repeats, 1))[: max(self.lengths)]
            for length in self.lengths:
                ids = head + before_ids + doc[:length] + after_ids
                prompts.append(ids)
                rows.append({"family": family, "length": length, "n_tokens": len(ids),
                             "docstring_start": len(head) + len(before_ids), "answer_pos": len(ids) - 1})
        return pd.DataFrame(rows), prompts, right, wrong

    def run(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        *,
        device: str | torch.device | None = None,
        batch_size: int = 32,
        label: str | None = None,
    ) -> "DocstringResult":
        """Score every (family, length) prompt with ``model`` (logits ``[batch, pos, d_vocab]``)."""
        checked = check_device(device)  # before building any prompt
        frame, prompts, right, wrong = self.build(tokenizer)
        device = checked if checked is not None else next(model.parameters()).device
        n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", None)
        longest = max(len(p) for p in prompts) + max(len(right), len(wrong))
        if n_ctx is not None and longest > n_ctx:
            raise UserInputError(f"the longest probe sequence has {longest} tokens but the model's n_ctx is {n_ctx}")
        pad = getattr(tokenizer, "pad_token_id", None)
        pad = 0 if pad is None else int(pad)
        seqs, offsets, cands = [], [], []
        for p in prompts:
            for cand in (right, wrong):
                seqs.append(p + cand)
                offsets.append(len(p))
                cands.append(cand)
        width = max(len(s) for s in seqs)
        tokens = torch.full((len(seqs), width), pad, dtype=torch.long)
        for i, s in enumerate(seqs):
            tokens[i, : len(s)] = torch.tensor(s)
        scores = torch.empty(len(seqs), dtype=torch.float64)
        with eval_mode(model), torch.inference_mode():
            for start in range(0, len(seqs), batch_size):
                chunk = tokens[start : start + batch_size].to(device)
                logprobs = torch.log_softmax(model(chunk).float(), dim=-1).cpu()
                for j in range(chunk.shape[0]):
                    i = start + j
                    pos = torch.arange(offsets[i] - 1, offsets[i] - 1 + len(cands[i]))
                    scores[i] = logprobs[j, pos, torch.tensor(cands[i])].sum().double()
        frame["logprob_right"] = scores[0::2].numpy()
        frame["logprob_wrong"] = scores[1::2].numpy()
        frame["margin"] = frame["logprob_right"] - frame["logprob_wrong"]
        frame["right_first"] = frame["margin"] > 0
        if label is None:
            label = str(getattr(getattr(model, "cfg", None), "label", type(model).__name__))
        return DocstringResult(frame=frame, label=label, right=self.right, wrong=self.wrong)


@dataclass(frozen=True, eq=False, repr=False)
class DocstringResult(Result):
    """`DocstringProbe.run`'s result: per (family, length), the log-probabilities (nats) of the two
    continuations and whether the right one wins. ``summary()`` is the readable table,
    ``to_dict()`` its numbers, ``save(dir)``/``load(dir)`` the shared result format."""

    frame: pd.DataFrame
    label: str
    right: str
    wrong: str

    def to_frame(self) -> pd.DataFrame:
        return self.frame.copy()

    def by_length(self) -> pd.DataFrame:
        """Per docstring length: mean margin and the fraction of families ranking the right answer first."""
        g = self.frame.groupby("length")
        return pd.DataFrame({"margin": g["margin"].mean(), "right_first": g["right_first"].mean()}).reset_index()

    def to_dict(self) -> dict[str, Any]:
        """Headline numbers: share of prompts ranking ``right`` first, worst/best length by margin, margin gap (nats)."""
        per_length = self.by_length()
        return {
            "label": self.label,
            "right_first": float(self.frame["right_first"].mean()),
            "worst_length": int(per_length.loc[per_length["margin"].idxmin(), "length"]),
            "best_length": int(per_length.loc[per_length["margin"].idxmax(), "length"]),
            "margin_gap": float(per_length["margin"].max() - per_length["margin"].min()),
        }

    def plot(self) -> Any:
        return plotting().profile.plot_docstring(self)
