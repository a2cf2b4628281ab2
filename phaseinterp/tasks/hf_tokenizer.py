"""The synthetic vocabulary (`Vocab`) as a Hugging Face tokenizer: id i is the vocabulary's token i.

A whitespace WordLevel tokenizer with no post-processor, so ``encode(vocab_text(vocab, ids)) == ids``;
written beside a checkpoint it lets ``AutoTokenizer.from_pretrained(folder)`` read it. Needs ``tokenizers``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence, Union

from phaseinterp._checks import check_int
from phaseinterp._files import atomic_write_text
from phaseinterp.errors import UserInputError
from phaseinterp.tasks.vocab import Vocab

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_tokenizers(purpose: str) -> Any:
    """The ``tokenizers`` package (the 'train' extra), imported on first use; ``purpose`` names what
    needs it in the error when it is missing."""
    try:
        import tokenizers
    except ImportError:
        raise UserInputError(f"{purpose} needs the `tokenizers` package (pip install 'phaseinterp[train]')") from None
    return tokenizers


def vocab_text(vocab: Vocab, ids: Sequence[int]) -> str:
    """``ids`` as the text the vocabulary's tokenizer encodes back to them: the words joined by single
    spaces (every word is whitespace-free, `Vocab`)."""
    tokens = vocab.tokens
    bad = [int(i) for i in ids if not 0 <= int(i) < len(tokens)]
    if bad:
        raise UserInputError(f"token id {bad[0]} is out of range for the {len(tokens)}-token vocabulary "
                             f"(0..{len(tokens) - 1})")
    return " ".join(tokens[int(i)] for i in ids)


def vocab_tokenizer(vocab: Vocab) -> Any:
    """A ``tokenizers.Tokenizer`` for ``vocab``: WordLevel (token i -> id i; no unknown token, so a word
    outside the vocabulary is an error, never a silent substitute), whitespace-only pre-tokenizer,
    the specials (``<pad>``, ``<bos>``, ...) registered as special tokens."""
    tokenizers = load_tokenizers("writing a Hugging Face tokenizer")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({word: i for i, word in enumerate(vocab.tokens)},
                                                                 unk_token=None))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in vocab.specials])
    return tokenizer


def tokenizer_config(vocab: Vocab, model_max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json`` for `vocab_tokenizer`: the fast tokenizer class, ``<bos>`` / ``<pad>`` /
    ``<sep>`` as BOS / padding / separator (no EOS: the vocabulary has none)."""
    model_max_length = check_int("model_max_length", model_max_length, 1)
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "pad_token": "<pad>",
            "sep_token": "<sep>", "model_max_length": model_max_length, "clean_up_tokenization_spaces": False,
            "add_bos_token": False, "add_eos_token": False}


def write_vocab_tokenizer(vocab: Vocab, folder: Union[str, Path], model_max_length: int) -> list[Path]:
    """Write `TOKENIZER_FILES` for ``vocab`` into the existing ``folder`` (each file atomically), replacing
    earlier ones; returns their paths. Same vocabulary, same bytes."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserInputError(f"folder={str(folder)!r} is not an existing folder to write the tokenizer into")
    serialized = json.loads(vocab_tokenizer(vocab).to_str())
    texts = {"tokenizer.json": json.dumps(serialized, indent=2, ensure_ascii=False) + "\n",
             "tokenizer_config.json": json.dumps(tokenizer_config(vocab, model_max_length), indent=2) + "\n"}
    paths = []
    for name in TOKENIZER_FILES:
        atomic_write_text(folder / name, texts[name])
        paths.append(folder / name)
    return paths


__all__ = ["TOKENIZER_FILES", "tokenizer_config", "vocab_text", "vocab_tokenizer", "write_vocab_tokenizer"]
