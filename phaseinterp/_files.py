"""Small shared plumbing: atomic file writes, JSON for numpy values, progress bars."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Union

import numpy as np

from phaseinterp.errors import UserInputError


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
    plain ``open(path, "w")`` would (0o666 less the umask), not the temporary file's 0o600."""
    path = Path(path)
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
    import ctypes
    import errno
    import sys

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


def check_output_dir(path: Union[str, os.PathLike]) -> Path:
    """``path`` as a Path if a folder can be written there (it exists as a folder, or its nearest
    existing ancestor is a writable folder); otherwise a ValueError naming it. Creates nothing,
    so callers can check before any expensive work and leave no partial output."""
    if isinstance(path, (bytes, bool)) or not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise UserInputError(f"output directory {path!r} must be a non-empty path")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserInputError(f"output directory {str(path)!r} is an existing file, not a directory")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UserInputError(f"output directory {str(path)!r} cannot be created: {str(probe)!r} is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserInputError(f"output directory {str(path)!r} is not writable ({str(probe)!r} denies write access)")
    return path


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for numpy scalars and arrays and paths."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"cannot serialize {type(value).__name__}")


def progress_bar(enabled: bool, total: int, desc: str, initial: int = 0, leave: bool = False):
    """A tqdm bar, or None when ``enabled`` is false or ``PHASEINTERP_NO_PROGRESS`` is set."""
    if not enabled or os.environ.get("PHASEINTERP_NO_PROGRESS"):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, leave=leave)
