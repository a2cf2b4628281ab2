"""Interrupting the test suite stops it, and takes the processes its tests started with it.

- SIGTERM becomes KeyboardInterrupt, as Ctrl-C: pytest stops the run and unwinds (fixtures,
  ``finally`` blocks, `run_child`'s clean-up) instead of dying with its children orphaned.
- `run_child` runs a command in its own process group and, when the test ends early (Ctrl-C,
  SIGTERM, a timeout, an error), terminates that group and waits for it; notebooks run this way,
  so their kernels' signal handlers (nbclient absorbs SIGINT and SIGTERM) never see the test
  run's signals.
- When the session ends, processes the tests started and left running are terminated.

Used by tests/conftest.py; ``python -m pytest -p interrupts`` loads it on its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _raise_interrupt)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first), read from /proc; [] where there is none."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # zombies are gone already
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in parents.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def end_processes(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM each of ``pids``, wait up to ``grace`` seconds, then SIGKILL what is left."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap our own children
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def pytest_sessionfinish(session, exitstatus):
    leftover = descendants(os.getpid())
    if leftover:
        end_processes(leftover)


def run_child(args: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True)`` in a new process group that is
    terminated (then killed), with everything it started, whenever this call does not return
    normally: the test's interrupt, SIGTERM, the timeout or any error."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, **kwargs)
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException:
        end_processes([*descendants(process.pid), process.pid])
        process.communicate()
        raise
    return subprocess.CompletedProcess(args, process.returncode, out, err)
