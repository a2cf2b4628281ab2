"""Tokenizers for pretraining: any folder with a ``tokenizer.json`` (Hugging Face ``tokenizers``
format), and a byte-level BPE trained on a local corpus for users who have none."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Optional, Union

from phaseinterp._checks import check_int
from phaseinterp._files import atomic_write, check_read_path, check_write_target, write_dir_atomically
from phaseinterp.errors import UserInputError
from phaseinterp.tasks.hf_tokenizer import load_tokenizers
from phaseinterp.train.corpus import documents, source_files

TOKENIZER_FILE = "tokenizer.json"
END_OF_TEXT = "<|endoftext|>"
_EOS_CANDIDATES = (END_OF_TEXT, "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` read from ``folder/tokenizer.json``, with the few calls pretraining makes.

    ``encode`` adds no special tokens; ``eos_id`` is the end-of-text token used between documents
    (None when the vocabulary has none of the usual names)."""

    def __init__(self, folder: Union[str, Path]):
        tokenizers = load_tokenizers("pretraining")
        folder = check_read_path(folder, f"a tokenizer folder (with {TOKENIZER_FILE}: `phaseinterp tokenizer train`)",
                                 name="tokenizer")
        path = folder / TOKENIZER_FILE
        if not path.is_file():
            raise UserInputError(f"tokenizer={str(folder)!r} has no {TOKENIZER_FILE} (train one with `phaseinterp "
                                 "tokenizer train --data PATH --vocab-size N --out DIR`)")
        raw = path.read_bytes()
        try:
            self._tok = tokenizers.Tokenizer.from_str(raw.decode())
        except Exception as err:  # tokenizers raises its own Exception type for a malformed file
            raise UserInputError(f"{path} is not a valid tokenizers file: {err}") from None
        self.folder = folder
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id: Optional[int] = next(
            (i for i in (self._tok.token_to_id(t) for t in _EOS_CANDIDATES) if i is not None), None)
        self.bos_token_id = None  # prompts start without a BOS (the corpus has none between documents)

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def id_to_token(self, i: int) -> Optional[str]:
        return self._tok.id_to_token(i)


def train_tokenizer(data: Union[str, Path], vocab_size: int, out: Union[str, Path], *, overwrite: bool = False,
                    progress: bool = True) -> Path:
    """Train a byte-level BPE of ``vocab_size`` tokens (``<|endoftext|>`` included) on ``data``
    (any source `corpus.documents` reads) and write ``tokenizer.json`` + ``tokenizer_config.json``
    into ``out``, a folder transformers' ``AutoTokenizer`` and `TextTokenizer` both load. ``out`` must be
    new or empty; a previous tokenizer there is replaced (whole, atomically) only with ``overwrite``."""
    check_int("vocab_size", vocab_size, 260, 1 << 20, why=": byte-level BPE needs the 256 bytes and the special token")
    out = check_write_target(out, "tokenizer", overwrite=overwrite, name="out")
    source_files(data)  # refuses a source with nothing in it before training
    tokenizers = load_tokenizers("pretraining")
    byte_level = tokenizers.pre_tokenizers.ByteLevel
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = byte_level(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT], show_progress=progress,
                                             initial_alphabet=byte_level.alphabet())
    tok.train_from_iterator((text for _, text in documents(data)), trainer=trainer)
    if tok.get_vocab_size() <= 257:
        raise UserInputError(f"data={str(data)!r} holds no text to train a tokenizer on")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": END_OF_TEXT, "bos_token": None,
              "unk_token": None, "pad_token": END_OF_TEXT, "model_max_length": 1 << 20,
              "clean_up_tokenization_spaces": False}

    def write(folder: Path) -> None:
        atomic_write(folder / TOKENIZER_FILE, tok.to_str().encode())
        atomic_write(folder / "tokenizer_config.json", json.dumps(config, indent=2).encode())

    return write_dir_atomically(out, write)
