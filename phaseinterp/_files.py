"""Small shared plumbing: atomic file writes, the write rule, JSON for numpy values, progress bars."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
from tqdm.auto import tqdm

from phaseinterp._checks import env_flag
from phaseinterp.errors import MissingPathError, UserInputError


def current_umask() -> int:
    """The process's umask (read without changing it where /proc allows)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it, then put it back
    os.umask(mask)
    return mask


def normal_mode(directory: bool = False) -> int:
    """The mode ``open()`` / ``mkdir()`` would give a new file or folder: 0o666 / 0o777 less the umask."""
    return (0o777 if directory else 0o666) & ~current_umask()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync, then rename over ``path``:
    readers see the old file or the new one, never a truncated one. The file gets the mode a
    plain ``open(path, "w")`` would (0o666 less the umask), not the temporary file's 0o600. A
    symbolic link at ``path`` stays: the file it points to is replaced (`through_links`)."""
    path = through_links(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), normal_mode())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(Path(path), text.encode())


def exchange_paths(a: Union[str, os.PathLike], b: Union[str, os.PathLike]) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``): a reader
    sees either the old or the new one, never neither. False where the system cannot (another OS,
    an old kernel or a file system without the flag): the caller falls back to two renames."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))


def is_path(value: Any) -> bool:
    """Whether ``value`` can name a file: a non-empty str or os.PathLike (not bytes) without NUL bytes."""
    if isinstance(value, (bytes, bool)) or not isinstance(value, (str, os.PathLike)):
        return False
    text = os.fspath(value)
    return isinstance(text, str) and bool(text) and "\x00" not in text


def expand_user(value: Any) -> Any:
    """``value`` with a leading ``~`` expanded to the home folder (a str stays a str, a path becomes a
    Path); anything else unchanged. Every path the user gives passes here."""
    if isinstance(value, (bytes, bool)) or not isinstance(value, (str, os.PathLike)):
        return value
    text = os.fspath(value)
    if not isinstance(text, str) or not text.startswith("~"):
        return value
    expanded = os.path.expanduser(text)
    return expanded if isinstance(value, str) else Path(expanded)


def check_output_dir(path: Union[str, os.PathLike], name: str = "output directory") -> Path:
    """``path`` as a Path if a folder can be written there (it exists as a folder, or its nearest
    existing ancestor is a writable folder); otherwise a ValueError naming it. Creates nothing,
    so callers can check before any expensive work and leave no partial output."""
    if not is_path(path):
        raise UserInputError(f"{name}={path!r} must be a non-empty path (a str or pathlib.Path, no NUL)")
    path = Path(expand_user(path))
    if path.is_symlink() and not path.exists():
        raise UserInputError(f"{name}={str(path)!r} is a dangling link (to {os.readlink(path)!r}, which does not "
                             "exist); remove the link or pass another path")
    if path.exists() and not path.is_dir():
        raise UserInputError(f"{name}={str(path)!r} is an existing file, not a directory")
    probe = path
    while not probe.exists():
        if probe.is_symlink():  # a link on the way to a folder to be made
            raise UserInputError(f"{name}={str(path)!r} cannot be created: {str(probe)!r} is a dangling link or a "
                                 "link loop")
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UserInputError(f"{name}={str(path)!r} cannot be created: {str(probe)!r} is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserInputError(f"{name}={str(path)!r} is not writable ({str(probe)!r} denies write access)")
    try:  # os.access says yes to root everywhere; a folder made and removed at once is the real test
        os.rmdir(tempfile.mkdtemp(dir=probe, prefix=".phaseinterp-write-test-"))
    except OSError as err:
        raise UserInputError(f"{name}={str(path)!r} is not writable: a folder cannot be made in {str(probe)!r} "
                             f"({err.strerror})") from None
    return path


def shown_path(name: str, given: Any) -> str:
    """``name='~/x' (= '/home/me/x')``: the argument, the path as the user gave it and, where ``~`` was
    expanded, the path it stands for."""
    text = os.fspath(given) if isinstance(given, (str, os.PathLike)) else str(given)
    expanded = os.path.expanduser(text)
    return f"{name}={text!r}" + (f" (= {expanded!r})" if expanded != text else "")


# What `check_read_path` expects at a path: a folder, a file, or either.
READ_EXPECTS = ("folder", "file", "any")


def _unreadable(path: Path, folder: bool) -> Optional[str]:
    """Why ``path`` cannot be read (None when it can): the permission bits (``os.access``), then an actual
    listing or opening, which also catches what the bits do not say (ACLs, a mount)."""
    if not os.access(path, os.R_OK | (os.X_OK if folder else 0)):
        return "permission denied"
    try:
        if folder:
            with os.scandir(path) as entries:
                next(entries, None)
        else:
            with open(path, "rb"):
                pass
    except OSError as err:
        return err.strerror or type(err).__name__
    return None


def check_read_path(path: Any, what: str, *, name: str = "path", expect: str = "folder") -> Path:
    """The one rule for every reader: ``path`` (the argument ``name``; ``what`` it should be) as a Path,
    ``~`` expanded, when there is something readable of the kind ``expect`` (`READ_EXPECTS`: ``"folder"``,
    ``"file"`` or ``"any"``); links are followed. Otherwise one error naming the argument, the path as
    given and as expanded, and the case, before anything is read: not a path (`UserInputError`); nothing
    there, or a dangling link (`MissingPathError`); a file where a folder is expected or the reverse; an
    empty folder; unreadable. ``tests/test_bad_inputs_fuzz.py::READERS`` walks the readers using it."""
    if expect not in READ_EXPECTS:
        # internal: every reader passes a literal kind; another one is a bug in phaseinterp, not bad input
        raise ValueError(f"internal: expect={expect!r} is not one of {READ_EXPECTS}")
    if not is_path(path):
        raise UserInputError(f"{name}={path!r} is not a path (a non-empty str or pathlib.Path without NUL); "
                             f"expected {what}")
    expanded = Path(expand_user(path))
    shown = shown_path(name, path)
    if expanded.is_symlink() and not expanded.exists():
        raise MissingPathError(f"{shown} is a link to {os.readlink(expanded)!r}, which does not exist (a dangling "
                               f"link); expected {what}")
    if not expanded.exists():
        where = "" if os.path.lexists(expanded.parent) else f" (nor does its folder {str(expanded.parent)!r})"
        raise MissingPathError(f"{shown} does not exist{where}; expected {what}")
    folder = expanded.is_dir()
    if expect == "folder" and not folder:
        raise UserInputError(f"{shown} is a file, not a folder; expected {what}")
    if expect == "file" and folder:
        raise UserInputError(f"{shown} is a folder, not a file; expected {what}")
    why = _unreadable(expanded, folder)
    if why is not None:
        raise UserInputError(f"{shown} cannot be read ({why}); expected {what}")
    if folder and not any(True for _ in expanded.iterdir()):
        raise UserInputError(f"{shown} is an empty folder; expected {what}")
    return expanded


def check_path_roles(outputs: dict[str, Any], inputs: Optional[dict[str, Any]] = None) -> None:
    """Refuse paths whose roles collide, before any work: two outputs that are the same folder or one
    inside the other, and an output that is an input or holds one. ``outputs`` and ``inputs`` map the
    argument's name to its path (None and non-paths skipped, links followed, ``~`` expanded). A
    `UserInputError` names both arguments and the path."""
    def real(value: Any) -> Optional[Path]:
        return Path(os.path.realpath(expand_user(value))) if is_path(value) else None

    outs = [(name, real(value)) for name, value in outputs.items() if real(value) is not None]
    ins = [(name, real(value)) for name, value in (inputs or {}).items()
           if real(value) is not None and os.path.lexists(expand_user(value))]
    for i, (a, path_a) in enumerate(outs):
        for b, path_b in outs[i + 1:]:
            if path_a == path_b:
                raise UserInputError(f"{a} and {b} are the same folder ({str(path_a)!r}); give each its own path")
            if path_b in path_a.parents or path_a in path_b.parents:
                inner, outer = (a, b) if path_b in path_a.parents else (b, a)
                raise UserInputError(f"{inner} {str(dict(outs)[inner])!r} is inside {outer} "
                                     f"{str(dict(outs)[outer])!r}: writing one would replace or mix with the other; "
                                     "give them separate folders")
        for b, path_b in ins:
            if path_a == path_b or path_a in path_b.parents:
                raise UserInputError(f"{a} {str(path_a)!r} {'is' if path_a == path_b else 'holds'} the input {b} "
                                     f"{str(path_b)!r}: the run would write over what it reads; pass another {a}")


def through_links(path: Union[str, os.PathLike]) -> Path:
    """``path`` with a symbolic link at its end followed (to the file or folder it points to): writers
    replace what the link names, never the link itself, so a user's link stays a link."""
    path = Path(path)  # absolute, so "." names the current folder by its place in its parent
    return Path(os.path.realpath(path)) if path.is_symlink() else Path(os.path.abspath(path))


# ------------------------------------------------------------ saved objects
# What each writer leaves in its folder, in the order they are recognised: (marker test, kind).
RESULT_KIND = "{} result"  # a `Result.save` folder, named by its class


def saved_kind(path: Union[str, os.PathLike]) -> Optional[str]:
    """What ``path`` holds, as a kind name: ``None`` (nothing, or an empty folder), ``"file"``,
    ``"<Class> result"``, ``"phaseinterp checkpoint"``, ``"Hugging Face checkpoint"``, ``"report"``,
    ``"shard folder"``, ``"training run"``, ``"pretraining run"``, ``"tokenizer"``, ``"lm-eval task"``, else
    ``"other files"``."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_dir():
        return "file"
    names = {p.name for p in path.iterdir()}
    if not names:
        return None
    if "pretrain.json" in names or (names == {"data"} and _only_token_cache(path / "data")):
        return "pretraining run"  # (a run stopped while it tokenized holds only its token cache)
    if "tokenizer.json" in names and "config.json" not in names:
        return "tokenizer"
    if "lm_eval_task.json" in names:
        return "lm-eval task"
    if "meta.json" in names and "arrays.npz" in names:
        try:
            meta = json.loads((path / "meta.json").read_text())
            if isinstance(meta, dict) and isinstance(meta.get("kind"), str):
                return RESULT_KIND.format(meta["kind"])
        except (OSError, ValueError):
            pass
    if "config.json" in names:
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict) and "weights_sha256" in config:
            return "phaseinterp checkpoint"
        if isinstance(config, dict) and "model_type" in config:
            return "Hugging Face checkpoint"
    if "index.html" in names and "summary.json" in names:
        return "report"
    if "run.json" in names or "shards" in names:
        return "shard folder"
    if "checkpoints" in names or "log.csv" in names:
        return "training run"
    return "other files"


_TOKEN_CACHE = {"train.bin", "heldout.bin", "manifest.json", ".train.bin.tmp", ".heldout.bin.tmp"}


def _only_token_cache(folder: Path) -> bool:
    """Does ``folder`` hold nothing but a pretraining run's token cache (`phaseinterp.train.corpus`)?"""
    if not folder.is_dir() or folder.is_symlink():
        return False
    names = {p.name for p in folder.iterdir()}
    return bool(names) and names <= _TOKEN_CACHE


_RESULT_FILES = {"meta.json", "arrays.npz"}  # what `Result.save` writes


def _check_staging_place(target: Path, shown: str, kind: str) -> None:
    """A staged writer makes its new folder beside an existing ``target`` and moves it into place: the
    folder holding ``target`` must take a new folder (refused before any work, not after)."""
    final = through_links(target)
    here = Path(os.path.realpath(os.getcwd()))
    if os.path.realpath(final) in (str(here), *map(str, here.parents)):
        raise UserInputError(f"{shown} is the current folder or holds it: the {kind} is written beside it and moved "
                             "into place, which would leave this process (and your shell) in a deleted folder; pass "
                             "a new folder, e.g. a subfolder of this one")
    parent = final.parent
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".phaseinterp-write-test-"))
    except OSError as err:
        raise UserInputError(f"{shown} exists, and the {kind} is written beside it and moved into place, but "
                             f"{str(parent)!r} takes no new folder ({err.strerror}); pass a folder that does not "
                             "exist yet in a writable place") from None


def check_write_target(path: Union[str, os.PathLike], kind: str, *, overwrite: bool = False,
                       name: str = "directory", flag: str = "overwrite=True (CLI: --overwrite) to replace it",
                       staged: bool = True) -> Path:
    """The one rule for every writer: may ``kind`` be written to the folder ``path``?

    Yes when ``path`` does not exist or is an empty folder (and a folder can be made there:
    `check_output_dir`). When it holds a previous object of the same ``kind`` (`saved_kind`), only
    with ``overwrite=True`` (CLI ``--overwrite``), and the writer then replaces it whole and
    atomically (`write_dir_atomically`). Anything else there (a file, another kind of saved object,
    other files) is never replaced: a `UserInputError` naming the argument, the path, what it holds
    and what would be accepted (``flag`` names the switch that allows the same kind). A saved result
    (`Result.save`: two files) is replaced only when the folder holds nothing else. A ``staged`` writer
    (`write_dir_atomically`) makes its folder beside an existing ``path``, so that place must take a
    new folder. Creates nothing, so a refusal leaves no trace.

    Writers that use it (``tests/test_bad_inputs.py::WRITERS`` walks each one):
    `Result.save` (every result object, `PhaseProfile` included), `CompressedTransformer.save_pretrained`,
    `HookedDeepseekV4.save_pretrained`, `phaseinterp.models.hf.export.export_release` (zoo export),
    `phaseinterp.report.build_report` (reports), the shard folders of `phaseinterp.parallel` (``runs._run``)
    (``kind="shard folder"``: a folder of the same run is resumed, which its run header checks) and
    `phaseinterp.train.train` ``out_dir`` (``kind="training run"``: resumed with ``resume=True``),
    `phaseinterp.train.pretrain.prepare` (``pretrain``'s ``out_dir``, ``kind="pretraining run"``, resumed the
    same way), `phaseinterp.train.tokenizer.train_tokenizer` (``kind="tokenizer"``),
    `phaseinterp.engines.lm_eval.write_lm_eval_task` (``kind="lm-eval task"``) and
    `phaseinterp.report.paper.write_paper_figures` (``phaseinterp paper --out``, ``kind="report"``).
    """
    target = check_output_dir(path, name)
    held = saved_kind(target)
    if held is None:
        if staged and target.exists():
            _check_staging_place(target, f"{name}={str(path)!r}", kind)
        return target
    shown = f"{name}={str(path)!r}"
    if held == "file":
        raise UserInputError(f"{shown} is an existing file, not a folder; pass a new folder for the {kind}")
    if held == kind:
        if not overwrite:
            raise UserInputError(f"{shown} already holds a {held}; pass {flag}, or a new or empty folder")
        extra = sorted(p.name for p in target.iterdir() if p.name not in _RESULT_FILES) if held.endswith(" result") else []
        if extra:  # a saved result is two files: anything else there is the user's, which a replacement would take
            listed = ", ".join(extra[:3]) + (", ..." if len(extra) > 3 else "")
            raise UserInputError(f"{shown} holds a {held} and also {listed}, which replacing it would delete; move "
                                 "them out first, or pass a new or empty folder")
        if staged:
            _check_staging_place(target, shown, kind)
        return target
    if held == "other files":
        entries = sorted(p.name for p in target.iterdir())
        listed = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UserInputError(f"{shown} is not empty and holds no saved {kind} (it has {listed}); pass a new or empty "
                             f"folder (or a previous {kind}'s folder: pass {flag})")
    raise UserInputError(f"{shown} holds a {held}, not a {kind}: it is never replaced by one; pass a new or empty "
                         "folder")


def check_file_target(path: Union[str, os.PathLike], *, overwrite: bool = False, name: str = "path",
                      flag: str = "overwrite=True (CLI: --overwrite) to replace it") -> Path:
    """The write rule for a single file: ``path`` as a Path when a file may be written there. A new
    path (in a folder that exists or can be made) is fine; an existing file only with ``overwrite``;
    a folder never. Otherwise a `UserInputError` naming the argument and the path. Creates nothing.

    Single-file writers that use it (``tests/test_bad_inputs.py::FILE_WRITERS`` walks each one):
    `phaseinterp.plot.export.save` (through `phaseinterp.plot.export.figure_targets`),
    `phaseinterp.plot.export.save_static` and
    `phaseinterp.report.check.first_screen_png`, each through `write_file_atomically`."""
    if not is_path(path):
        raise UserInputError(f"{name}={path!r} must be a non-empty path (a str or pathlib.Path, no NUL)")
    path = Path(expand_user(path))
    if path.is_dir():
        raise UserInputError(f"{name}={str(path)!r} is a folder; pass a file path")
    check_output_dir(path.parent, name=f"{name}={str(path)!r}: its folder")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise UserInputError(f"{name}={str(path)!r} already exists; pass {flag}, or a new file name")
    return path


def write_file_atomically(path: Union[str, os.PathLike], data: Union[bytes, str, Callable[[Path], Any]], *,
                          overwrite: bool = False, name: str = "path") -> Path:
    """Write one file at ``path``: ``data`` (bytes or text), or ``data(temporary_path)`` for a library
    that writes to a path itself. Written to a hidden temporary file in the same folder and moved into
    place in one step, so a failure leaves ``path`` as it was. An existing file is replaced only with
    ``overwrite`` (`check_file_target`, checked again at the move)."""
    path = through_links(check_file_target(path, overwrite=overwrite, name=name))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_file_beside(path)
    try:
        if callable(data):
            data(tmp)
        else:
            with open(tmp, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, normal_mode())
        move_file_into_place(tmp, path, overwrite=overwrite, name=name)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def temporary_file_beside(path: Path) -> Path:
    """A new empty hidden file beside ``path`` (same folder, so a rename moves it into place), keeping
    ``path``'s suffix last (libraries that pick a format from the suffix still see it)."""
    fd, name = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).stem}.", suffix=f".tmp{Path(path).suffix}")
    os.close(fd)
    return Path(name)


def move_file_into_place(tmp: Path, path: Path, *, overwrite: bool = False, name: str = "path") -> None:
    """Move the finished file ``tmp`` to ``path`` in one step. Without ``overwrite`` a file at ``path``
    (one that appeared after `check_file_target`) is never replaced: a hard link refuses it atomically."""
    if not tmp.is_file():  # its writer removed it (kaleido does on a failed render): nothing to move
        raise OSError(errno.ENOENT, f"the finished file for {name}={str(path)!r} is missing: its writer removed "
                                    "it or never wrote it", str(tmp))
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise UserInputError(f"{name}={str(path)!r} already exists; pass overwrite=True (CLI: --overwrite) to "
                             "replace it, or a new file name") from None
    except OSError as err:
        if err.errno not in _NO_HARD_LINKS:
            raise
        os.replace(tmp, path)  # a file system without hard links: the check before the work stands
        return
    os.unlink(tmp)


# What os.link raises where the file system has no hard links (FAT, some network and FUSE mounts):
# only these fall back to a plain rename; anything else (a missing file) is an error.
_NO_HARD_LINKS = {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EOPNOTSUPP,
                  getattr(errno, "ENOTSUP", errno.EOPNOTSUPP), errno.EACCES}


def staging_dir(final: Path) -> Path:
    """An empty hidden folder beside ``final`` (same file system, so a rename moves it into place),
    with the mode a plain ``mkdir`` would give (not mkdtemp's 0o700). Beside the folder a link at
    ``final`` points to, where there is one (`through_links`)."""
    final = through_links(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    os.chmod(path, normal_mode(directory=True))
    return path


def move_into_place(staging: Path, final: Path) -> None:
    """Move the finished folder ``staging`` to ``final``. A previous folder there is exchanged with
    the new one in one atomic step where the system allows it (`exchange_paths`), then deleted;
    elsewhere it is moved aside first (two renames: for an instant ``final`` is missing). A link at
    ``final`` is never moved: the folder it points to is (`through_links`)."""
    final = through_links(final)
    if final.exists() and exchange_paths(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # now holds the previous folder
    elif final.exists():
        old = final.parent / f".{final.name}.previous-{os.getpid()}"
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, final)


def write_dir_atomically(final: Union[str, os.PathLike], write: Callable[[Path], Any]) -> Path:
    """Call ``write(staging)`` on an empty sibling folder of ``final``, then move it into place
    (`move_into_place`): a reader sees the previous folder or the complete new one, and a failure
    or interrupt leaves ``final`` as it was. Check ``final`` first with `check_write_target`. A symbolic
    link at ``final`` stays a link: the folder it points to is the one replaced (`through_links`)."""
    final = through_links(expand_user(final))
    staging = staging_dir(final)
    try:
        write(staging)
        move_into_place(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for numpy scalars and arrays and paths."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"cannot serialize {type(value).__name__}")


def check_metadata(metadata: Any, name: str = "metadata") -> dict:
    """``metadata`` as the plain JSON dict a checkpoint stores (numpy scalars and arrays and paths
    become numbers, lists and strings); None is ``{}``. A non-dict, a non-string key or a value JSON
    cannot hold (a tensor, an object) is a `UserInputError` naming the key and the value's type,
    before anything is written."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise UserInputError(f"{name}={metadata!r} must be a dict of JSON values (str keys)")
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise UserInputError(f"{name} key {key!r} must be a string (JSON object keys are strings)")
        try:
            json.dumps(value, default=json_default, allow_nan=True)
        except (TypeError, ValueError) as err:
            raise UserInputError(f"{name}[{key!r}]={value!r} ({type(value).__name__}) cannot be stored as JSON "
                                 f"({err}); pass numbers, strings, lists or dicts (e.g. tensor.tolist())") from None
    return json.loads(json.dumps(metadata, default=json_default))


def progress_bar(enabled: bool, total: int, desc: str, initial: int = 0, leave: bool = False):
    """A tqdm bar, or None when ``enabled`` is false or ``PHASEINTERP_NO_PROGRESS`` is set."""
    if not enabled or env_flag("PHASEINTERP_NO_PROGRESS"):
        return None
    return tqdm(total=total, initial=initial, desc=desc, leave=leave)
