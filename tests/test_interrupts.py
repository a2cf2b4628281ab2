"""Interrupting the test suite (Ctrl-C or SIGTERM) stops it, and ends the processes tests started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # spawns processes and signals them
TESTS = Path(__file__).resolve().parent

# A test that starts a child (plain, or through run_child like the notebook tests) and waits.
INNER = """
import signal, subprocess, sys, time
from pathlib import Path
from interrupts import run_child

def test_waits(tmp_path):
    sleeper = subprocess.Popen(["sleep", "300"])
    Path({pids!r}).write_text(str(sleeper.pid))
    if {through_run_child}:
        # ignores SIGINT, as nbclient's handlers do, and starts a grandchild
        code = ("import signal, subprocess, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "subprocess.Popen(['sleep', '300']); time.sleep(300)")
        run_child([sys.executable, "-c", code], timeout=300)
    time.sleep(300)

def test_never_reached():
    pass
"""


def _default_sigint() -> None:
    """The inner run gets Ctrl-C as a terminal would deliver it, even when this suite runs in a
    background shell job (which starts with SIGINT ignored, and Python then keeps it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("sig, through_run_child", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                                    (signal.SIGINT, True), (signal.SIGTERM, True)],
                         ids=["SIGINT", "SIGTERM", "SIGINT-run_child", "SIGTERM-run_child"])
def test_interrupted_run_stops_and_ends_its_children(sig, through_run_child, tmp_path):
    from interrupts import descendants

    pids = tmp_path / "pids"
    (tmp_path / "test_inner.py").write_text(INNER.format(pids=str(pids), through_run_child=through_run_child))
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "interrupts", "-p", "no:cacheprovider",
                            "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True, preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() or (through_run_child and len(descendants(run.pid)) < 3):
            assert time.monotonic() < deadline and run.poll() is None, "the inner test did not start"
            time.sleep(0.1)
        started = descendants(run.pid)
        run.send_signal(sig)
        out, _ = run.communicate(timeout=30)  # a run that absorbed the signal would time out here
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
    assert "test_never_reached" not in out and "2 passed" not in out, out
    time.sleep(0.5)
    survivors = [p for p in started if _alive(p)]
    assert not survivors, f"processes started by the interrupted tests survive: {survivors}\n{out}"
