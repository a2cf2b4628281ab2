"""Prebuilt llama.cpp without a compile: ``llama-cpp-py-sync``'s wheel, made to load on an older glibc.

The wheel links four C23 functions of glibc 2.38 (``__isoc23_strtol``, ``__isoc23_strtoul``,
``__isoc23_strtoull``, ``__isoc23_sscanf``) that differ from the classic ones only in reading ``0b``
literals. On an older glibc `compatible_library_dir` writes a copy whose dynamic symbols name the
classic functions (``GLIBC_2.2.5``) and drops the ``GLIBC_2.38`` requirement; any other symbol needing
a newer glibc is refused by name. The ELF edit, per shared object (ELF64 little-endian)::

    for each dynamic symbol s named "__isoc23_X", X in C23_ALIASES:
        s.st_name += len("__isoc23_")          # "X" is the tail of the same .dynstr string
        versym[s] = index of GLIBC_2.2.5 in the same .gnu.version_r file entry (libc.so.6)
    unlink every .gnu.version_r entry GLIBC_v with v > machine's glibc (now no symbol uses it)

`PrebuiltLlama` is the small backend over that copy, through the wheel's own cffi declarations. It
cannot share a process with llama-cpp-python (same sonames) and refuses to load beside it."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional, Union

import numpy as np

from phaseinterp._checks import check_int, check_real
from phaseinterp._files import check_read_path
from phaseinterp.errors import UserInputError

PACKAGE = "llama_cpp_py_sync"
DISTRIBUTION = "llama-cpp-py-sync"
C23_PREFIX = "__isoc23_"
C23_ALIASES = ("strtol", "strtoul", "strtoull", "sscanf")  # __isoc23_X -> X: same function, plus "0b" literals
BASE_VERSION = "GLIBC_2.2.5"  # x86_64's first glibc symbol version: every classic libc function has it
PATCH_REVISION = 1  # part of the cache folder's key: a change to the edit invalidates old copies
MANIFEST = "phaseinterp-patch.json"
LOAD_ORDER = ("libggml-base", "libggml-cpu", "libggml-rpc", "libggml", "libllama")  # dependencies first

_SHT_DYNSYM, _SHT_DYNAMIC = 11, 6
_SHT_GNU_VERNEED, _SHT_GNU_VERSYM = 0x6FFFFFFE, 0x6FFFFFFF
_DT_NEEDED = 1
_VERSYM_HIDDEN = 0x8000


class PrebuiltLibraryError(ImportError):
    """The prebuilt llama.cpp cannot be used here: not installed, an ELF it cannot edit, a symbol
    that needs a newer glibc than the machine's (named), or a library that does not load. An
    ImportError, so code that treats a missing optional backend as absent keeps working."""


def check_supported(name: str, value, valid) -> None:
    """A `UserInputError` unless ``value`` is one of ``valid``: ``name='x' is not supported (valid: a, b)``."""
    if value not in valid:
        raise UserInputError(f"{name}={value!r} is not supported (valid: {', '.join(valid)})")


# ------------------------------------------------------------------ glibc versions
def parse_version(text: str) -> Optional[tuple[int, ...]]:
    """``"GLIBC_2.3.4"`` or ``"glibc 2.36"`` -> ``(2, 3, 4)`` / ``(2, 36)``; None if not numeric
    (``GLIBC_PRIVATE``)."""
    tail = text.replace("GLIBC_", "").replace("glibc", "").strip()
    parts = tail.split(".")
    if not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def machine_glibc() -> Optional[tuple[int, ...]]:
    """This process's glibc version (``os.confstr("CS_GNU_LIBC_VERSION")``), None if not glibc."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        return None
    return parse_version(text) if text else None


def _version_text(version: Optional[Sequence[int]]) -> str:
    """``(2, 36)`` -> ``"2.36"``; ``"unknown"`` for None (not glibc)."""
    return ".".join(map(str, version)) if version else "unknown"


# ------------------------------------------------------------------ ELF reading
@dataclasses.dataclass(frozen=True)
class VersionNeed:
    """One ``.gnu.version_r`` auxiliary entry: ``file`` (``libc.so.6``) must provide ``name``
    (``GLIBC_2.38``), referred to from ``.gnu.version`` by ``index``. ``offset`` is the entry's
    file offset, ``parent`` its file entry's (Verneed) offset."""

    file: str
    name: str
    index: int
    flags: int
    offset: int
    parent: int


@dataclasses.dataclass(frozen=True)
class DynamicSymbol:
    """One ``.dynsym`` entry: its table ``index``, ``name``, ``name_offset`` into ``.dynstr``,
    ``version_index`` (``.gnu.version``, hidden bit cleared) and whether it is undefined here."""

    index: int
    name: str
    name_offset: int
    version_index: int
    undefined: bool


class ElfImage:
    """The dynamic-linking tables of one ELF64 little-endian shared object, read from ``data``:
    ``symbols`` (`DynamicSymbol`), ``needs`` (`VersionNeed`), ``needed`` (DT_NEEDED names), and
    the file offsets an edit writes to."""

    def __init__(self, data: Union[bytes, bytearray], name: str = "<elf>"):
        self.name = name
        if data[:4] != b"\x7fELF":
            raise PrebuiltLibraryError(f"{name} is not an ELF file")
        if data[4] != 2 or data[5] != 1:
            raise PrebuiltLibraryError(f"{name} is not ELF64 little-endian (class {data[4]}, data {data[5]})")
        (_, _, _, _, _, _, shoff, _, _, _, _, shentsize, shnum, _) = struct.unpack_from("<16sHHIQQQIHHHHHH", data, 0)
        if shoff == 0 or shnum == 0:
            raise PrebuiltLibraryError(f"{name} has no section headers (needed to find its version tables)")
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

        def only(kind: int):
            found = [s for s in sections if s[1] == kind]
            return found[0] if found else None

        dynsym, versym, verneed, dynamic = (only(k) for k in (_SHT_DYNSYM, _SHT_GNU_VERSYM, _SHT_GNU_VERNEED,
                                                             _SHT_DYNAMIC))
        if dynsym is None:
            raise PrebuiltLibraryError(f"{name} has no .dynsym (not a shared object?)")
        dynstr = sections[dynsym[6]]  # sh_link

        def string(offset: int) -> str:
            start = dynstr[4] + offset
            end = data.index(b"\0", start)
            return bytes(data[start:end]).decode("utf-8", "replace")

        self.string = string
        self.needs: list[VersionNeed] = []
        if verneed is not None:
            pos = verneed[4]
            for _ in range(verneed[7]):  # sh_info: the number of Verneed entries
                _, vn_cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", data, pos)
                aux = pos + vn_aux
                for _ in range(vn_cnt):
                    _, flags, other, vna_name, vna_next = struct.unpack_from("<IHHII", data, aux)
                    self.needs.append(VersionNeed(string(vn_file), string(vna_name), other, flags, aux, pos))
                    if vna_next == 0:
                        break
                    aux += vna_next
                if vn_next == 0:
                    break
                pos += vn_next
        self.versym_offset = versym[4] if versym is not None else None
        n_symbols = dynsym[5] // 24
        self.symbol_offset, self.symbols = dynsym[4], []
        for i in range(n_symbols):
            st_name, _, _, st_shndx, _, _ = struct.unpack_from("<IBBHQQ", data, dynsym[4] + 24 * i)
            version = 1
            if versym is not None:
                (version,) = struct.unpack_from("<H", data, versym[4] + 2 * i)
            self.symbols.append(DynamicSymbol(i, string(st_name), st_name, version & ~_VERSYM_HIDDEN, st_shndx == 0))
        self.needed: list[str] = []
        if dynamic is not None:
            for pos in range(dynamic[4], dynamic[4] + dynamic[5], 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == 0:
                    break
                if tag == _DT_NEEDED:
                    self.needed.append(string(value))

    def version_of(self, symbol: DynamicSymbol) -> Optional[VersionNeed]:
        """The `VersionNeed` a symbol's ``.gnu.version`` entry names (None: local, global or defined here)."""
        return next((n for n in self.needs if n.index == symbol.version_index), None)

    def newer_glibc_needs(self, glibc: Sequence[int]) -> list[VersionNeed]:
        """The ``GLIBC_x.y`` needs above ``glibc``."""
        return [n for n in self.needs if n.name.startswith("GLIBC_") and (parse_version(n.name) or (0,)) > tuple(glibc)]

    def glibc_requirements(self) -> dict[str, list[str]]:
        """``{"GLIBC_2.38": ["__isoc23_strtol", ...], ...}``: the undefined symbols per glibc version."""
        out: dict[str, list[str]] = {}
        for symbol in self.symbols:
            need = self.version_of(symbol)
            if symbol.undefined and need is not None and need.name.startswith("GLIBC_"):
                out.setdefault(need.name, []).append(symbol.name)
        return out


# ------------------------------------------------------------------ the check and the edit
def too_new_symbols(requirements: Mapping[str, Sequence[str]], glibc: Sequence[int]) -> dict[str, list[str]]:
    """The part of ``requirements`` (`ElfImage.glibc_requirements`) above ``glibc`` that
    `patch_elf` cannot rewrite: ``{version: [symbol, ...]}`` for every symbol not one of the
    ``__isoc23_`` aliases of `C23_ALIASES`. Empty when the object can be made to load."""
    bad: dict[str, list[str]] = {}
    for version, symbols in requirements.items():
        parsed = parse_version(version)
        if parsed is None or parsed <= tuple(glibc):
            continue
        rest = [s for s in symbols if not _is_c23_alias(s)]
        if rest:
            bad[version] = sorted(rest)
    return bad


def _is_c23_alias(symbol: str) -> bool:
    return symbol.startswith(C23_PREFIX) and symbol[len(C23_PREFIX):] in C23_ALIASES


def refusal(name: str, bad: Mapping[str, Sequence[str]], glibc: Sequence[int]) -> str:
    """The one-line reason `patch_elf` refuses ``name``."""
    listed = ", ".join(f"{s}@{v}" for v, symbols in sorted(bad.items()) for s in symbols)
    return (f"{name} needs symbols newer than this machine's glibc {_version_text(glibc)} that have no older "
            f"equivalent: {listed} (only {', '.join(C23_PREFIX + a for a in C23_ALIASES)} can be rewritten); "
            "use a llama.cpp built for this glibc (pip install 'phaseinterp[llama-source]', which compiles llama-cpp-python)")


def patch_elf(data: bytes, glibc: Sequence[int], name: str = "<elf>") -> tuple[bytes, list[str]]:
    """``data`` edited to load on ``glibc`` (module doc), and the symbols it renamed; ``data``
    itself (and ``[]``) when nothing needs a newer glibc. Raises `PrebuiltLibraryError` (one line)
    when another symbol needs a newer glibc, or libc's ``GLIBC_2.2.5`` is not among its needs."""
    image = ElfImage(data, name)
    glibc = tuple(glibc)
    newer = image.newer_glibc_needs(glibc)
    if not newer:
        return data, []
    bad = too_new_symbols(image.glibc_requirements(), glibc)
    if bad:
        raise PrebuiltLibraryError(refusal(name, bad, glibc))
    if image.versym_offset is None:
        raise PrebuiltLibraryError(f"{name} needs glibc versions but has no .gnu.version table")
    out = bytearray(data)
    renamed = []
    newer_index = {n.index: n for n in newer}
    for symbol in image.symbols:
        need = newer_index.get(symbol.version_index)
        if need is None:
            continue
        base = next((n for n in image.needs if n.parent == need.parent and n.name == BASE_VERSION), None)
        if base is None:
            raise PrebuiltLibraryError(f"{name} has no {BASE_VERSION} need on {need.file} to move {symbol.name} to "
                                       f"(its {need.file} versions: "
                                       f"{', '.join(n.name for n in image.needs if n.parent == need.parent)})")
        if image.string(symbol.name_offset + len(C23_PREFIX)) != symbol.name.removeprefix(C23_PREFIX):
            raise PrebuiltLibraryError(f"{name}: symbol {symbol.name}'s name does not end as expected")  # cannot happen
        struct.pack_into("<I", out, image.symbol_offset + 24 * symbol.index, symbol.name_offset + len(C23_PREFIX))
        struct.pack_into("<H", out, image.versym_offset + 2 * symbol.index, base.index)
        renamed.append(symbol.name)
    for need in newer:
        _unlink_need(out, image, need)
    return bytes(out), renamed


def _unlink_need(out: bytearray, image: ElfImage, need: VersionNeed) -> None:
    """Remove one Vernaux from its Verneed's chain: the previous entry's ``vna_next`` (or the
    Verneed's ``vn_aux``) skips it and ``vn_cnt`` drops by one; the bytes stay as dead data."""
    siblings = [n for n in image.needs if n.parent == need.parent]
    position = siblings.index(need)
    if len(siblings) == 1:
        raise PrebuiltLibraryError(f"{image.name}: {need.name} is the only version needed from {need.file}")
    (next_rel,) = struct.unpack_from("<I", out, need.offset + 12)
    version, count, file_name, aux, vn_next = struct.unpack_from("<HHIII", out, need.parent)
    if position == 0:
        aux += next_rel
    else:
        previous = siblings[position - 1].offset
        (prev_next,) = struct.unpack_from("<I", out, previous + 12)
        struct.pack_into("<I", out, previous + 12, 0 if next_rel == 0 else prev_next + next_rel)
    struct.pack_into("<HHIII", out, need.parent, version, count - 1, file_name, aux, vn_next)
    # Re-read so that a second unlink in the same Verneed sees the new chain.
    image.needs = [n for n in image.needs if n.offset != need.offset]


# ------------------------------------------------------------------ the cached copy
def installed_library_dir() -> Path:
    """The installed ``llama_cpp_py_sync`` package folder (its ``libllama.so`` and ``libggml-*``)
    without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PrebuiltLibraryError(f"the prebuilt llama.cpp is not installed: pip install {DISTRIBUTION} "
                                   "(a manylinux wheel, nothing to compile)")
    return Path(list(spec.submodule_search_locations)[0])


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/phaseinterp`` (``~/.cache/phaseinterp`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "phaseinterp"


def library_files(folder: Path) -> list[Path]:
    """The shared objects of a llama.cpp library folder (``lib*.so*``), sorted by name."""
    return sorted(p for p in Path(folder).glob("lib*.so*") if p.is_file() or p.is_symlink())


def load_order(folder: Path) -> list[Path]:
    """The folder's llama.cpp libraries in `LOAD_ORDER` (each one's dependencies before it)."""
    files = {p.name: p for p in library_files(folder)}
    order = []
    for stem in LOAD_ORDER:
        match = files.get(f"{stem}.so.0") or files.get(f"{stem}.so")
        if match is not None:
            order.append(match)
    return order


def _package_version(folder: Path) -> str:
    version_file = folder / "_version.py"
    if version_file.is_file():
        for line in version_file.read_text().splitlines():
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("\"'")
    return "unknown"


def compatible_library_dir(source: Union[str, Path, None] = None, *, cache_root: Union[str, Path, None] = None,
                           glibc: Optional[Sequence[int]] = None, verify: bool = True) -> Path:
    """A folder of llama.cpp libraries that load on this machine: ``source`` itself (default: the
    installed ``llama_cpp_py_sync``) when no library needs a glibc newer than ``glibc`` (default: the
    machine's), else a patched copy (`patch_elf`, every ``lib*.so*`` side by side) in ``cache_root /
    "llama-cpp-py-sync-<version>-glibc<glibc>-<sha>"``, staged, checked (``verify``) and renamed into
    place; a later call returns it. Raises `PrebuiltLibraryError` with one line."""
    source = Path(source) if source is not None else installed_library_dir()
    files = library_files(source)
    if not load_order(source):
        raise PrebuiltLibraryError(f"{source} holds no llama.cpp libraries (libllama.so, libggml-base.so.0, ...)")
    glibc = tuple(glibc) if glibc is not None else machine_glibc()
    if glibc is None:  # not glibc (musl): nothing this edit can do; the loader's own error will say why
        return source
    digest = hashlib.sha256(f"revision {PATCH_REVISION}\n".encode())
    needs_patch = False
    for path in files:
        data = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(data).digest())
        if not path.is_symlink():
            needs_patch |= bool(ElfImage(data, path.name).newer_glibc_needs(glibc))
    if not needs_patch:
        return source
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = root / f"{DISTRIBUTION}-{_package_version(source)}-glibc{_version_text(glibc)}-{digest.hexdigest()[:16]}"
    if (target / MANIFEST).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would carry over to the shared cache folder
    try:
        record = {"source": str(source), "version": _package_version(source), "glibc": _version_text(glibc),
                  "revision": PATCH_REVISION, "files": {}}
        for path in files:
            if path.is_symlink():
                os.symlink(os.readlink(path), staging / path.name)
                continue
            data = path.read_bytes()
            patched, renamed = patch_elf(data, glibc, path.name)
            (staging / path.name).write_bytes(patched)
            os.chmod(staging / path.name, 0o755)
            record["files"][path.name] = {"sha256": hashlib.sha256(data).hexdigest(),
                                          "patched_sha256": hashlib.sha256(patched).hexdigest(),
                                          "renamed": renamed}
        (staging / MANIFEST).write_text(json.dumps(record, indent=2))
        if verify:
            check_loads(staging)
        try:
            os.rename(staging, target)
        except OSError:  # another process renamed its copy first: use that one
            if not (target / MANIFEST).is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def check_loads(folder: Union[str, Path], timeout: float = 120.0) -> None:
    """``ctypes.CDLL`` of each library of `load_order` in a fresh Python process (so a library
    that fails or crashes leaves this one clean); raises `PrebuiltLibraryError` with the loader's
    message (``version `GLIBC_2.38' not found ...``) in one line."""
    timeout = check_real("timeout", timeout, 0.0, low_open=True, why=" (seconds)")
    paths = [str(p) for p in load_order(Path(folder))]
    code = "import ctypes, sys\nfor p in sys.argv[1:]:\n    ctypes.CDLL(p)\n"
    done = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit code {done.returncode}"
        raise PrebuiltLibraryError(f"the llama.cpp libraries in {folder} do not load on this machine "
                                   f"(glibc {_version_text(machine_glibc())}): "
                                   f"{last}")


# ------------------------------------------------------------------ the backend
GGML_TYPES = {"f32": 0, "f16": 1}  # enum ggml_type: the KV cache types offered
STATE_FUNCTIONS = ("llama_state_seq_get_size", "llama_state_seq_get_data", "llama_state_seq_set_data")


def _has_function(lib, name: str) -> bool:
    """Whether the opened library exports ``name`` (cffi resolves a declared function on first use)."""
    try:
        getattr(lib, name)
    except (AttributeError, NotImplementedError):
        return False
    return True


def _loaded_elsewhere(folder: Path) -> Optional[str]:
    """A llama.cpp library (by file name) already mapped into this process from another folder."""
    names = {p.name for p in library_files(folder)} | {"libllama.so.0", "libggml-base.so.0", "libggml.so.0"}
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if len(line.split()) >= 6 else ""
        if path.startswith("/") and Path(path).name in names and Path(path).parent.resolve() != folder.resolve():
            return path
    return None


_LOG: collections.deque = collections.deque(maxlen=500)  # llama.cpp's recent log lines, for error messages
_LOG_STATE: dict = {"callback": None, "echo": False}


def _capture_log(ffi, lib, echo: bool) -> None:
    """Route llama.cpp's log into `_LOG` (and to stderr while ``echo``). One callback per process,
    kept alive here: llama.cpp holds the pointer globally."""
    _LOG_STATE["echo"] = echo
    if _LOG_STATE["callback"] is None:
        string, write = ffi.string, sys.stderr.write  # bound now: a model freed at interpreter exit still logs

        def log(level, text, user_data):
            try:
                line = string(text).decode("utf-8", "replace")
            except Exception:  # cffi half torn down at exit: an exception here is printed, never raised
                return
            _LOG.append(line)
            if _LOG_STATE["echo"]:
                write(line)

        _LOG_STATE["callback"] = ffi.callback("void(enum ggml_log_level, const char *, void *)", log)
        lib.llama_log_set(_LOG_STATE["callback"], ffi.NULL)


def _last_error(what: str) -> str:
    """llama.cpp's last logged line that says ``error`` or ``failed`` (its reason), or a pointer to ``verbose``."""
    for line in reversed(_LOG):
        if "error" in line.lower() and line.strip():
            return line.strip()
    return f"llama.cpp logged no reason for the failed {what} (verbose=True shows its whole log)"


class PrebuiltLlama:
    """One GGUF model and one context in the prebuilt llama.cpp (`compatible_library_dir`), through
    ``llama_cpp_py_sync``'s cffi declarations.

    Parameters:
        gguf_path: the model file.
        n_ctx, n_batch, n_ubatch: context size, tokens per ``llama_decode``, tokens per compute step
            (``n_ubatch`` default ``n_batch``).
        cache_type: KV cache element type, ``"f16"`` or ``"f32"`` (`GGML_TYPES`).
        n_threads: CPU threads (default ``os.cpu_count()``).
        flash_attn: llama.cpp's flash attention.
        library_dir: a folder holding ``libllama.so`` (default `compatible_library_dir()`).
        verbose: keep llama.cpp's log on stderr.

    Attributes: ``n_vocab``, ``n_ctx`` (as llama.cpp made it), ``n_batch``, ``n_ubatch``, ``cache_type``,
    ``path``, ``library_dir``, ``can_checkpoint`` (the per-sequence state API of `save_state`). One
    sequence (id 0); not thread-safe; `close` frees the context and the model."""

    def __init__(self, gguf_path: Union[str, Path], *, n_ctx: int, n_batch: int, n_ubatch: Optional[int] = None,
                 cache_type: str = "f16", n_threads: Optional[int] = None, flash_attn: bool = False,
                 library_dir: Union[str, Path, None] = None, verbose: bool = False):
        path = check_read_path(gguf_path, "a GGUF model file", name="gguf_path", expect="file")
        check_supported("cache_type", cache_type, GGML_TYPES)
        n_ubatch = n_batch if n_ubatch is None else n_ubatch
        n_ctx, n_batch, n_ubatch = (check_int(label, value, 1) for label, value in
                                    (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_ubatch", n_ubatch)))
        folder = Path(library_dir) if library_dir is not None else compatible_library_dir()
        other = _loaded_elsewhere(folder)
        if other is not None:
            raise PrebuiltLibraryError(f"another llama.cpp is already loaded in this process ({other}); its libraries "
                                       f"have the same names as the prebuilt's in {folder}: use one per process")
        try:
            from llama_cpp_py_sync._cffi_bindings import ffi
        except ImportError as err:
            raise PrebuiltLibraryError(f"the prebuilt llama.cpp is not installed: pip install {DISTRIBUTION} "
                                       f"({err})") from None
        try:
            lib = ffi.dlopen(str(folder / "libllama.so"))
        except OSError as err:
            raise PrebuiltLibraryError(f"{folder / 'libllama.so'} does not load: {str(err).splitlines()[0]}") from None
        self._ffi, self._lib, self._model, self._ctx, self._batch = ffi, lib, ffi.NULL, ffi.NULL, None
        # Bound now: cffi resolves a function on first use, which fails once the interpreter shuts down.
        self._free = (lib.llama_batch_free, lib.llama_free, lib.llama_model_free)
        _capture_log(ffi, lib, echo=verbose)
        lib.llama_backend_init()
        model_params = lib.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self._model = lib.llama_model_load_from_file(str(path).encode(), model_params)
        if self._model == ffi.NULL:
            raise RuntimeError(f"llama.cpp could not load the model {path}: {_last_error('load')}")
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_ubatch, 1
        threads = n_threads or os.cpu_count() or 1
        params.n_threads = params.n_threads_batch = threads
        params.type_k = params.type_v = GGML_TYPES[cache_type]
        params.flash_attn_type = 1 if flash_attn else 0  # LLAMA_FLASH_ATTN_TYPE_ENABLED / _DISABLED
        params.embeddings = False
        self._ctx = lib.llama_init_from_model(self._model, params)
        if self._ctx == ffi.NULL:
            self.close()
            raise RuntimeError(f"llama.cpp could not create a context for {path} (n_ctx={n_ctx}, n_batch={n_batch}): "
                               f"{_last_error('context')}")
        self._memory = lib.llama_get_memory(self._ctx)
        self.n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model)))
        self.n_ctx, self.n_batch, self.n_ubatch = int(lib.llama_n_ctx(self._ctx)), n_batch, n_ubatch
        self.path, self.library_dir, self.cache_type = path, folder, cache_type
        self._batch = lib.llama_batch_init(n_batch, 0, 1)
        self.can_checkpoint = all(_has_function(lib, name) for name in STATE_FUNCTIONS)

    def clear(self) -> None:
        """Forget every cached position of every sequence (``llama_memory_clear``, data too)."""
        self._lib.llama_memory_clear(self._memory, True)

    def keep_prefix(self, length: int) -> None:
        """Remove positions ``>= length`` of sequence 0 (``llama_memory_seq_rm(mem, 0, length, -1)``);
        raises RuntimeError where the memory cannot cut there (a recurrent or compressed state)."""
        if not self._lib.llama_memory_seq_rm(self._memory, 0, int(length), -1):
            raise RuntimeError(f"llama.cpp cannot remove the positions >= {length} of sequence 0 of {self.path.name}")

    def decode(self, tokens: Sequence[int], start: int) -> None:
        """One ``llama_decode`` of ``tokens`` at positions ``start, start + 1, ...`` of sequence 0,
        logits requested for the last token only. Raises ValueError when the piece exceeds
        ``n_batch`` and RuntimeError with llama.cpp's return code when decoding fails."""
        n = len(tokens)
        if not 1 <= n <= self.n_batch:
            raise UserInputError(f"a piece of {n} tokens does not fit n_batch={self.n_batch} (valid: 1..{self.n_batch})")
        batch = self._batch
        for i, token in enumerate(tokens):
            batch.token[i] = int(token)
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if i == n - 1 else 0
        batch.n_tokens = n
        code = self._lib.llama_decode(self._ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code} for {n} tokens at positions {start}..{start + n - 1}")

    def save_state(self) -> bytes:
        """Sequence 0's cached state as bytes (``llama_state_seq_get_data``: its KV cells and any
        per-sequence state, DeepSeek-V4's compressor windows included), for `load_state`; a
        checkpoint as llama-server takes one after a prompt's prefix. Raises `PrebuiltLibraryError`
        where the library lacks the state API (`can_checkpoint`)."""
        self._require_state()
        size = int(self._lib.llama_state_seq_get_size(self._ctx, 0))
        buffer = self._ffi.new("uint8_t[]", size)
        written = int(self._lib.llama_state_seq_get_data(self._ctx, buffer, size, 0))
        if not 0 < written <= size:
            raise RuntimeError(f"llama_state_seq_get_data wrote {written} bytes of sequence 0 ({size} expected)")
        return bytes(self._ffi.buffer(buffer, written))

    def load_state(self, state: bytes) -> None:
        """Sequence 0 as `save_state` left it: the memory cleared, then ``state`` restored
        (``llama_state_seq_set_data``); the next `decode` continues at the saved length."""
        self._require_state()
        self.clear()
        source = self._ffi.from_buffer("uint8_t[]", state)
        read = int(self._lib.llama_state_seq_set_data(self._ctx, source, len(state), 0))
        if read != len(state):
            raise RuntimeError(f"llama_state_seq_set_data read {read} of {len(state)} bytes: the state does not fit "
                               f"this context ({_last_error('state restore')})")

    def _require_state(self) -> None:
        if not self.can_checkpoint:
            raise PrebuiltLibraryError(f"{self.library_dir / 'libllama.so'} has no {' / '.join(STATE_FUNCTIONS)}: "
                                       "this build cannot save a sequence's state")

    def last_logits(self) -> np.ndarray:
        """The float32 logits ``[n_vocab]`` of the last decoded token (``llama_get_logits_ith(ctx, -1)``), copied."""
        pointer = self._lib.llama_get_logits_ith(self._ctx, -1)
        if pointer == self._ffi.NULL:
            raise RuntimeError("llama.cpp holds no logits (nothing decoded since the context was made?)")
        buffer = self._ffi.buffer(pointer, 4 * self.n_vocab)
        return np.frombuffer(buffer, dtype=np.float32).copy()

    def close(self) -> None:
        """Free the batch, the context and the model (idempotent)."""
        batch_free, context_free, model_free = self._free
        if self._batch is not None:
            batch_free(self._batch)
            self._batch = None
        if self._ctx != self._ffi.NULL:
            context_free(self._ctx)
            self._ctx = self._ffi.NULL
        if self._model != self._ffi.NULL:
            model_free(self._model)
            self._model = self._ffi.NULL

    def __del__(self):
        if getattr(self, "_free", None) is not None:
            self.close()

    def __repr__(self) -> str:
        return (f"PrebuiltLlama({str(self.path)!r}, n_ctx={self.n_ctx}, n_batch={self.n_batch}, "
                f"cache_type={self.cache_type!r}, n_vocab={self.n_vocab})")


__all__ = ["C23_ALIASES", "ElfImage", "GGML_TYPES", "PrebuiltLibraryError", "PrebuiltLlama", "STATE_FUNCTIONS", "check_loads",
           "compatible_library_dir", "installed_library_dir", "machine_glibc", "patch_elf", "too_new_symbols"]
