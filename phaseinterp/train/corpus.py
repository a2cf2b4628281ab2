"""Natural-text corpora for pretraining: documents streamed from disk (text, JSONL ``{"text": ...}``, parquet
or a saved ``datasets`` dataset with a ``text`` column, or a folder of these, in sorted order), tokenized
once into a memory-mapped token file, sampled as packed windows whose order is a function of ``(seed, step)``."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from phaseinterp._checks import check_real
from phaseinterp._files import atomic_write, check_read_path, expand_user, progress_bar
from phaseinterp.errors import UserInputError

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
TOKEN_DTYPE = np.uint32
MANIFEST = "manifest.json"
CHUNK_CHARS = 1 << 20  # a long text file is read (and tokenized) a megabyte of lines at a time


def _is_hf_dataset(path: Path) -> bool:
    return path.is_dir() and (path / "dataset_info.json").is_file() and (path / "state.json").is_file()


def source_files(data: Union[str, Path]) -> list[Path]:
    """The files (or saved datasets) a source stands for, sorted; refused when there are none."""
    path = check_read_path(data, "a text, JSONL or parquet file, a folder of them, or a datasets folder written by "
                                 "save_to_disk", name="data", expect="any")
    if path.is_file() or _is_hf_dataset(path):
        return [path]
    found = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        root_path = Path(root)
        if _is_hf_dataset(root_path):
            found.append(root_path)
            dirs.clear()
            continue
        for name in sorted(files):
            if name.lower().endswith(TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES):
                found.append(root_path / name)
    if not found:
        raise UserInputError(f"data={str(data)!r} is a folder with no text, JSONL or parquet files and no saved "
                             f"dataset (accepted suffixes: {', '.join(TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES)})")
    return found


def _text_documents(path: Path) -> Iterator[str]:
    """A text file is one document, read in chunks of whole lines so a huge file never sits in memory."""
    with open(path, encoding="utf-8", errors="replace") as f:
        chunk, size = [], 0
        for line in f:
            chunk.append(line)
            size += len(line)
            if size >= CHUNK_CHARS:
                yield "".join(chunk)
                chunk, size = [], 0
        if chunk:
            yield "".join(chunk)


def _jsonl_documents(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserInputError(f"{path}:{number} is not a JSON object ({err.msg}); a JSONL corpus has one "
                                     '{"text": ...} per line') from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise UserInputError(f'{path}:{number} has no string "text" field (keys: '
                                     f"{sorted(record) if isinstance(record, dict) else type(record).__name__})")
            yield text


def _parquet_documents(path: Path) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserInputError(f"{path} is a parquet file; reading it needs pyarrow (pip install pyarrow)") from None
    table = pq.ParquetFile(path)
    if "text" not in table.schema_arrow.names:
        raise UserInputError(f"{path} has no 'text' column (columns: {table.schema_arrow.names})")
    for batch in table.iter_batches(columns=["text"], batch_size=256):
        yield from (t for t in batch.column(0).to_pylist() if isinstance(t, str))


def _dataset_documents(path: Path) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise UserInputError(f"{path} is a saved Hugging Face dataset; reading it needs `datasets`") from None
    dataset = datasets.load_from_disk(str(path))
    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            raise UserInputError(f"{path} is a DatasetDict without a 'train' split (splits: {list(dataset)})")
        dataset = dataset["train"]
    if "text" not in dataset.column_names:
        raise UserInputError(f"{path} has no 'text' column (columns: {dataset.column_names})")
    for row in dataset.select_columns(["text"]):
        if isinstance(row["text"], str):
            yield row["text"]


def documents(data: Union[str, Path]) -> Iterator[tuple[str, str]]:
    """``(document key, text)`` for every document of ``data``, streamed in a fixed order. The key is
    ``"<file within the source>:<index in the file>"`` (a single-file source: its name), so it does not
    depend on where the source lies or how its path is spelled: the held-out split (`is_held_out`) is
    the same for a copy of the corpus anywhere."""
    data = expand_user(data)
    root = Path(data)
    for path in source_files(data):
        within = path.name if path == root else path.relative_to(root).as_posix()
        name = path.name.lower()
        if _is_hf_dataset(path):
            reader = _dataset_documents
        elif name.endswith(JSONL_SUFFIXES):
            reader = _jsonl_documents
        elif name.endswith(PARQUET_SUFFIXES):
            reader = _parquet_documents
        else:
            reader = _text_documents
        for i, text in enumerate(reader(path)):
            if text.strip():
                yield f"{within}:{i}", text


def fingerprint(data: Union[str, Path]) -> str:
    """What the token cache depends on in the source: every file's path, size and modification time."""
    h = hashlib.sha256()
    for path in source_files(data):
        items = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for p in items:
            st = p.stat()
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


_CONTENT: dict[str, str] = {}  # fingerprint (paths, sizes, mtimes) -> content_fingerprint, in this process


def content_fingerprint(data: Union[str, Path]) -> str:
    """What the tokens depend on in the source, wherever it lies: sha256 over every file's path within the
    source (the documents' keys, so the held-out split), size and bytes. A copy of the corpus on another
    machine or path has the same one; an edit changes it. Memoized per `fingerprint` in this process."""
    data = expand_user(data)
    quick = fingerprint(data)
    if quick in _CONTENT:
        return _CONTENT[quick]
    root = Path(data)
    h = hashlib.sha256()
    for path in source_files(data):
        items = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for p in items:
            within = p.name if p == root else p.relative_to(root).as_posix()
            h.update(f"{within}\0{p.stat().st_size}\n".encode())
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
    _CONTENT[quick] = h.hexdigest()
    return _CONTENT[quick]


# How `documents` keys the held-out split (in the cache manifest: a cache keyed otherwise is rebuilt).
# Before 2026-12-06 the key held the file's path as given, so moving the corpus changed the split.
SPLIT_KEYS = "path within the source"


def is_held_out(key: str, fraction: float) -> bool:
    """Whether document ``key`` belongs to the held-out split (a hash of the key: stable, order-free)."""
    u = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64
    return u < fraction


@dataclass(frozen=True)
class TokenizedCorpus:
    """The corpus as two memory-mapped token files (``train.bin``, ``heldout.bin``) and their manifest."""

    folder: Path
    manifest: dict

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    def tokens(self, split: str = "train") -> np.memmap:
        if split not in ("train", "heldout"):
            raise UserInputError(f"split={split!r} is not one of ('train', 'heldout')")
        n = int(self.manifest[f"{split}_tokens"])
        if n == 0:
            return np.zeros(0, dtype=TOKEN_DTYPE)
        return np.memmap(self.folder / f"{split}.bin", dtype=TOKEN_DTYPE, mode="r", shape=(n,))


def tokenize_corpus(data: Union[str, Path], tokenizer, folder: Union[str, Path], *, heldout_fraction: float = 0.02,
                    progress: bool = True) -> TokenizedCorpus:
    """Tokenize ``data`` once into ``folder``, reused while the source's content (`content_fingerprint`)
    and the tokenizer's sha256 are the same (`fingerprint` skips re-reading unmoved files).

    Documents are separated by the tokenizer's end-of-text token when it has one; each goes to the
    held-out split with probability ``heldout_fraction`` (`is_held_out`). Files are renamed into place,
    the manifest last."""
    heldout_fraction = check_real("heldout_fraction", heldout_fraction, 0.0, 1.0, high_open=False,
                                  why=" (the share of documents held out)")
    folder, data = Path(expand_user(folder)), expand_user(data)
    quick = {"source": str(Path(data).resolve()), "fingerprint": fingerprint(data)}
    same = {"tokenizer_sha256": tokenizer.sha256, "heldout_fraction": heldout_fraction,
            "vocab_size": tokenizer.vocab_size, "split_keys": SPLIT_KEYS}
    manifest_path = folder / MANIFEST
    if manifest_path.is_file():
        have = json.loads(manifest_path.read_text())
        if all(have.get(k) == v for k, v in same.items()):
            untouched = all(have.get(k) == v for k, v in quick.items())
            if untouched and "content_sha256" in have:
                return TokenizedCorpus(folder, have)
            content = content_fingerprint(data)
            if have.get("content_sha256", content if untouched else None) == content:
                have = {**have, **quick, "content_sha256": content}  # moved, copied, or an older cache
                atomic_write(manifest_path, json.dumps(have, indent=2, sort_keys=True).encode())
                return TokenizedCorpus(folder, have)
    wanted = {**quick, **same, "content_sha256": content_fingerprint(data)}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = {s: folder / f".{s}.bin.tmp" for s in ("train", "heldout")}
    counts = {"train": 0, "heldout": 0}
    n_docs = {"train": 0, "heldout": 0}
    eos = tokenizer.eos_id
    bar = progress_bar(progress, 0, "tokenize")
    with open(tmp["train"], "wb") as train_file, open(tmp["heldout"], "wb") as heldout_file:
        files = {"train": train_file, "heldout": heldout_file}
        pending: list[tuple[str, str]] = []

        def flush() -> None:
            for (key, _), ids in zip(pending, tokenizer.encode_batch([t for _, t in pending])):
                split = "heldout" if is_held_out(key, heldout_fraction) else "train"
                if eos is not None:
                    ids = list(ids) + [eos]
                np.asarray(ids, dtype=TOKEN_DTYPE).tofile(files[split])
                counts[split] += len(ids)
                n_docs[split] += 1
            if bar is not None:
                bar.update(len(pending))
            pending.clear()

        for item in documents(data):
            pending.append(item)
            if len(pending) >= 64:
                flush()
        flush()
    if bar is not None:
        bar.close()
    if counts["train"] == 0:
        for p in tmp.values():
            p.unlink(missing_ok=True)
        raise UserInputError(f"data={str(data)!r} holds no text (0 tokens after tokenizing)")
    for split, p in tmp.items():
        os.replace(p, folder / f"{split}.bin")
    manifest = {**wanted, "train_tokens": counts["train"], "heldout_tokens": counts["heldout"],
                "train_documents": n_docs["train"], "heldout_documents": n_docs["heldout"]}
    atomic_write(manifest_path, json.dumps(manifest, indent=2, sort_keys=True).encode())
    return TokenizedCorpus(folder, manifest)


def window_starts(n_tokens: int, seq_len: int, seed: int, step: int, rows: range) -> np.ndarray:
    """Where global row ``i`` of step ``step`` starts: uniform over ``0..n_tokens - seq_len - 1``,
    drawn from a generator seeded by ``(seed, step, i)``, so any process count reads the same rows."""
    high = n_tokens - seq_len  # a window is seq_len + 1 tokens (inputs and shifted targets)
    if high < 1:
        raise UserInputError(f"the corpus has {n_tokens} training tokens, fewer than seq_len + 1 = {seq_len + 1}")
    return np.array([np.random.default_rng([seed, step, i]).integers(0, high) for i in rows], dtype=np.int64)


def packed_rows(tokens: np.ndarray, seq_len: int, seed: int, step: int,
                rows: range) -> Int[Tensor, "row seq_plus_one"]:
    """Rows ``rows`` of step ``step``'s global batch: packed windows of ``seq_len + 1`` tokens."""
    starts = window_starts(len(tokens), seq_len, seed, step, rows)
    out = np.stack([np.asarray(tokens[s : s + seq_len + 1], dtype=np.int64) for s in starts])
    return torch.from_numpy(out)
