"""`LlamaCppEngine`: next-token log-probs from llama.cpp in process, on the prebuilt ``llama-cpp-py-sync``
wheel (`PrebuiltLlama`) or ``llama-cpp-python``. Each prompt row goes in as token ids into a fresh
sequence, one ``llama_decode`` per piece of ``schedule``; the last position's logits become float32
log-probs. `LlamaCppEngine.warm` answers from the KV cache a donor prompt left."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from phaseinterp._checks import check_int
from phaseinterp._files import check_read_path
from phaseinterp.engines.adapters import Schedule, _check_pieces, check_warm_rows
from phaseinterp.engines.llama_prebuilt import (GGML_TYPES, PrebuiltLibraryError, PrebuiltLlama, _loaded_elsewhere,
                                                _version_text, check_supported, compatible_library_dir,
                                                machine_glibc)
from phaseinterp.errors import UserInputError

EXTRA = "llama"  # pyproject's optional extra: the prebuilt llama.cpp
SOURCE_EXTRA = "llama-source"  # pyproject's optional extra: llama-cpp-python, compiled on install
BACKENDS = ("auto", "prebuilt", "llama-cpp-python")
CACHE_TYPES = ("f16", "f32")  # llama.cpp's KV cache types offered here (GGML_TYPE_F16 = 1, GGML_TYPE_F32 = 0)
REUSE = ("checkpoint", "seq_rm")  # how `LlamaCppEngine.warm` keeps the shared prefix


def import_llama_cpp():
    """``llama_cpp``, or an ImportError that names the extra to install; a prebuilt library linked
    against a newer glibc than this machine's (its loader says ``GLIBC_x.y' not found``) is an
    ImportError naming both versions and the source build."""
    try:
        import llama_cpp
    except (ImportError, OSError, RuntimeError) as err:  # llama_cpp wraps the loader's OSError in a RuntimeError
        needed = re.search(r"GLIBC_(\d+(?:\.\d+)+)", str(err))
        if needed:
            raise ImportError(f"llama_cpp's prebuilt library needs glibc {needed.group(1)} but this machine has glibc "
                              f"{_version_text(machine_glibc())}: build llama-cpp-python from source instead (pip install --force-reinstall "
                              f"--no-binary llama-cpp-python llama-cpp-python, as pip install 'phaseinterp[{SOURCE_EXTRA}]' "
                              "does)") from None
        if not isinstance(err, ImportError):
            raise
        raise ImportError(f"LlamaCppEngine(backend='llama-cpp-python') needs llama-cpp-python (>= 0.3.36, DeepSeek-V4 "
                          f"support): pip install 'phaseinterp[{SOURCE_EXTRA}]' (it builds llama.cpp from source; "
                          f"{err})") from None
    return llama_cpp


class SourceLlama:
    """llama-cpp-python's ``llama_cpp.Llama`` behind `PrebuiltLlama`'s calls (``clear``,
    ``decode(tokens, start)``, ``keep_prefix``, ``save_state``/``load_state``, ``last_logits``,
    ``close``), so `LlamaCppEngine` drives either backend the same way. ``decode`` continues the
    sequence at ``start`` (``Llama.eval`` first drops the positions from ``n_tokens`` on)."""

    can_checkpoint = True

    def __init__(self, path: Path, *, n_ctx: int, n_batch: int, cache_type: str, n_threads: Optional[int],
                 flash_attn: bool, verbose: bool):
        if "llama_cpp" not in sys.modules:
            _refuse_beside_the_prebuilt()
        llama_cpp = import_llama_cpp()
        self._llama_cpp = llama_cpp
        ggml_type = GGML_TYPES[cache_type]  # the values of llama.cpp's enum ggml_type
        self.llama = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                     n_threads=n_threads, n_threads_batch=n_threads, logits_all=False,
                                     type_k=ggml_type, type_v=ggml_type, flash_attn=flash_attn, verbose=verbose)
        self.path, self.n_vocab = path, int(self.llama.n_vocab())

    def clear(self) -> None:
        self.llama.reset()  # n_tokens = 0: the next eval removes every cached position of the sequence

    def decode(self, tokens: Sequence[int], start: int) -> None:
        self.llama.n_tokens = start
        self.llama.eval(list(tokens))

    def keep_prefix(self, length: int) -> None:
        memory = self._llama_cpp.llama_get_memory(self.llama.ctx)
        if not self._llama_cpp.llama_memory_seq_rm(memory, 0, length, -1):
            raise RuntimeError(f"llama.cpp cannot remove the positions >= {length} of sequence 0 of {self.path.name}")
        self.llama.n_tokens = length

    def save_state(self):
        return self.llama.save_state()

    def load_state(self, state) -> None:
        self.llama.load_state(state)  # n_tokens = the saved length, the memory as it was then

    def last_logits(self) -> np.ndarray:
        pointer = self._llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float32, copy=True)

    def close(self) -> None:
        self.llama.close()


def _refuse_beside_the_prebuilt() -> None:
    """The prebuilt's libraries carry llama-cpp-python's sonames: importing llama_cpp after them would bind
    its calls to the other build's symbols. One clear line instead."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return
    other = _loaded_elsewhere(Path(list(spec.submodule_search_locations)[0]) / "lib")
    if other is not None:
        raise PrebuiltLibraryError(f"another llama.cpp is already loaded in this process ({other}): llama-cpp-python's "
                                   "libraries have the same names; use one backend per process")


def open_backend(backend: str, path: Path, *, n_ctx: int, n_batch: int, cache_type: str, n_threads: Optional[int],
                 flash_attn: bool, verbose: bool, library_dir: Union[str, Path, None] = None):
    """``(name, llama)``: the backend `LlamaCppEngine` runs on: ``"prebuilt"`` (`PrebuiltLlama` on
    `compatible_library_dir`), ``"llama-cpp-python"`` (`SourceLlama`) or ``"auto"`` (the prebuilt when it
    loads here, else llama-cpp-python, else one ImportError naming both reasons). A prebuilt that cannot
    load is a `PrebuiltLibraryError` naming the library, the symbol and this machine's glibc."""
    def prebuilt():
        folder = compatible_library_dir(library_dir)
        return PrebuiltLlama(path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, cache_type=cache_type,
                             n_threads=n_threads, flash_attn=flash_attn, library_dir=folder, verbose=verbose)

    def source():
        return SourceLlama(path, n_ctx=n_ctx, n_batch=n_batch, cache_type=cache_type, n_threads=n_threads,
                           flash_attn=flash_attn, verbose=verbose)

    if backend == "prebuilt":
        return "prebuilt", prebuilt()
    if backend == "llama-cpp-python":
        return "llama-cpp-python", source()
    if sys.modules.get("llama_cpp") is not None:  # llama-cpp-python is loaded already: the prebuilt cannot join it
        return "llama-cpp-python", source()
    try:
        return "prebuilt", prebuilt()
    except PrebuiltLibraryError as prebuilt_error:
        try:
            return "llama-cpp-python", source()
        except ImportError as source_error:
            raise ImportError(f"LlamaCppEngine found no llama.cpp that runs here: the prebuilt (pip install "
                              f"'phaseinterp[{EXTRA}]'): {prebuilt_error}; llama-cpp-python: {source_error}") from None


class LlamaCppEngine:
    """An `Engine` over a GGUF model run by llama.cpp (module docstring).

    Parameters:
        gguf_path: the ``.gguf`` file.
        n_ctx: context length llama.cpp allocates (the longest prompt must fit).
        n_batch: tokens per ``llama_decode`` (also ``n_ubatch``), at least the largest piece; default ``n_ctx``.
        schedule: prompt length -> piece lengths (`chunked_pieces`, ...), or ``None`` for one piece.
        cache_type: the KV cache's element type, ``"f16"`` or ``"f32"``.
        n_threads: CPU threads (default: llama.cpp's choice).
        flash_attn: llama.cpp's flash attention.
        reuse: how `warm` keeps the donor's prefix cache: ``"checkpoint"`` (state saved after the prefix
            and restored after the donor) or ``"seq_rm"`` (the donor's positions from the prefix on
            removed in place, ``llama_memory_seq_rm``); a library or memory without that support refuses.
        name: the engine's name in results.
        backend: ``"auto"``, ``"prebuilt"`` or ``"llama-cpp-python"`` (`open_backend`); the two cannot
            share a process.
        library_dir: the prebuilt wheel's library folder (default the installed one); prebuilt only.
        verbose: llama.cpp's log on stderr.

    Attributes: ``backend`` (the one in use), ``llama`` (its `PrebuiltLlama` or `SourceLlama`)."""

    def __init__(self, gguf_path: Union[str, Path], n_ctx: int = 4096, n_batch: Optional[int] = None, *,
                 schedule: Optional[Schedule] = None, cache_type: str = "f16", n_threads: Optional[int] = None,
                 flash_attn: bool = False, reuse: str = "checkpoint", name: Optional[str] = None,
                 backend: str = "auto", library_dir: Union[str, Path, None] = None, verbose: bool = False):
        path = check_read_path(gguf_path, "a GGUF model file (e.g. the output of llama.cpp's convert_hf_to_gguf.py)",
                               name="gguf_path", expect="file")
        check_int("n_ctx", n_ctx, 1)
        n_batch = n_ctx if n_batch is None else n_batch
        check_int("n_batch", n_batch, 1)
        if n_batch > n_ctx:
            raise UserInputError(f"n_batch={n_batch} is larger than n_ctx={n_ctx} (valid: 1..{n_ctx})")
        check_supported("cache_type", cache_type, CACHE_TYPES)
        if n_threads is not None:
            check_int("n_threads", n_threads, 1)
        check_supported("reuse", reuse, REUSE)
        check_supported("backend", backend, BACKENDS)
        if library_dir is not None and backend == "llama-cpp-python":
            raise UserInputError("library_dir= is the prebuilt wheel's folder: it does not apply to "
                                 "backend='llama-cpp-python'")
        self.backend, self.llama = open_backend(backend, path, n_ctx=n_ctx, n_batch=n_batch, cache_type=cache_type,
                                                n_threads=n_threads, flash_attn=flash_attn, verbose=verbose,
                                                library_dir=library_dir)
        self.path, self.n_ctx, self.n_batch, self.schedule = path, n_ctx, n_batch, schedule
        self.cache_type, self.reuse, self.d_vocab = cache_type, reuse, int(self.llama.n_vocab)
        self._check_reuse(reuse)
        self.name = name or f"llama.cpp:{path.name}"

    def _check_reuse(self, reuse: str) -> None:
        if reuse == "checkpoint" and not self.llama.can_checkpoint:
            raise UserInputError(f"reuse='checkpoint' needs llama.cpp's per-sequence state API, which the {self.backend} "
                                 f"library in use lacks ({self.llama!r}); use reuse='seq_rm'")

    def with_schedule(self, schedule: Optional[Schedule], name: str, *, reuse: Optional[str] = None) -> "LlamaCppEngine":
        """The same loaded model fed in another schedule (and ``reuse``, when given; a view sharing
        ``self.llama``; not thread-safe)."""
        if reuse is not None:
            check_supported("reuse", reuse, REUSE)
        view = object.__new__(LlamaCppEngine)
        view.__dict__.update(self.__dict__)
        view.schedule, view.name, view.reuse = schedule, name, reuse or self.reuse
        view._check_reuse(view.reuse)
        return view

    def _pieces(self, length: int) -> list[int]:
        pieces = _check_pieces(self.schedule(length) if self.schedule is not None else [length], length)
        if max(pieces) > self.n_batch:
            raise UserInputError(f"a piece of {max(pieces)} tokens exceeds n_batch={self.n_batch}: llama.cpp would cut "
                                 f"it at its own batch boundaries; raise n_batch (valid: up to n_ctx={self.n_ctx})")
        return pieces

    def _ids(self, row: Int[Tensor, " pos"]) -> list[int]:
        ids = [int(t) for t in row.tolist()]
        if len(ids) > self.n_ctx:
            raise UserInputError(f"a prompt of {len(ids)} tokens does not fit n_ctx={self.n_ctx}")
        bad = [t for t in ids if not 0 <= t < self.d_vocab]
        if bad:
            raise UserInputError(f"token id {bad[0]} is outside the GGUF's vocabulary (0..{self.d_vocab - 1})")
        return ids

    def _feed(self, ids: list[int], start: int, pieces: Sequence[int]) -> None:
        """``ids`` decoded from position ``start`` on, one ``llama_decode`` per piece."""
        for n in pieces:
            self.llama.decode(ids[:n], start)
            ids, start = ids[n:], start + n

    def _batches(self, length: int) -> list[int]:
        return [min(self.n_batch, length - s) for s in range(0, length, self.n_batch)]

    def logits(self, row: Int[Tensor, " pos"]) -> np.ndarray:
        """The float32 logits after ``row``'s last token, the prompt fed in this engine's pieces."""
        ids = self._ids(row)
        self.llama.clear()
        self._feed(ids, 0, self._pieces(len(ids)))
        return self.llama.last_logits()

    def warm_logits(self, donor: Int[Tensor, " pos"], row: Int[Tensor, " pos"], prefix_len: int) -> np.ndarray:
        """The float32 logits after ``row``'s last token, computed from the cache ``donor`` left of
        their shared first ``prefix_len`` tokens (``reuse``, see the class doc): only
        ``row[prefix_len:]`` is evaluated. Pieces are ``n_batch`` tokens (the schedule is not used)."""
        donor_ids, ids = self._ids(donor), self._ids(row)
        self.llama.clear()
        if self.reuse == "checkpoint":
            self._feed(donor_ids[:prefix_len], 0, self._batches(prefix_len))
            checkpoint = self.llama.save_state()
            self._feed(donor_ids[prefix_len:], prefix_len, self._batches(len(donor_ids) - prefix_len))
            self.llama.load_state(checkpoint)  # the memory as it was after the prefix
        else:
            self._feed(donor_ids, 0, self._batches(len(donor_ids)))
            try:
                self.llama.keep_prefix(prefix_len)
            except RuntimeError:
                raise UserInputError(f"llama.cpp refused to drop positions {prefix_len}.. of the donor "
                                     f"(llama_memory_seq_rm returned false: {self.path.name}'s memory cannot remove "
                                     "part of a sequence, as DeepSeek-V4's compressed KV cache cannot): use "
                                     "reuse='checkpoint'") from None
        self._feed(ids[prefix_len:], prefix_len, self._batches(len(ids) - prefix_len))
        return self.llama.last_logits()

    def __call__(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_vocab"]:
        if tokens.ndim != 2:
            raise UserInputError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
        return _logprobs([self.logits(row) for row in tokens.cpu()])

    def warm(self, donors: Int[Tensor, "batch pos"], tokens: Int[Tensor, "batch pos"],
             prefix_len: int) -> Float[Tensor, "batch d_vocab"]:
        """Log-probs after each row of ``tokens``, answered right after its donor row (`WarmEngine`;
        `warm_logits`)."""
        check_warm_rows(donors, tokens, prefix_len)
        return _logprobs([self.warm_logits(d, t, prefix_len) for d, t in zip(donors.cpu(), tokens.cpu())])

    def close(self) -> None:
        """Free llama.cpp's model and context now (also done when the engine is garbage-collected)."""
        self.llama.close()

    def __repr__(self) -> str:
        return (f"LlamaCppEngine({str(self.path)!r}, n_ctx={self.n_ctx}, n_batch={self.n_batch}, "
                f"cache_type={self.cache_type!r}, reuse={self.reuse!r}, backend={self.backend!r}, d_vocab={self.d_vocab})")


def _logprobs(rows: list[np.ndarray]) -> Float[Tensor, "batch d_vocab"]:
    return torch.log_softmax(torch.from_numpy(np.stack(rows)).float(), dim=-1)


__all__ = ["BACKENDS", "CACHE_TYPES", "REUSE", "LlamaCppEngine", "SourceLlama", "import_llama_cpp", "open_backend"]
