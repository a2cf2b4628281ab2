"""What the llama.cpp test modules share: the converter's source, llama-cpp-python's presence, and the
DeepSeek-V4 fixture converted to GGUF by llama.cpp's own converter (``benchmarks/llama_cpp_dsv4.py``).
``missing(why, optional=...)`` is the calling module's skip-or-fail rule."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "llama_cpp_dsv4.py"


def require_llama_cpp_python(missing) -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError as err:
        missing(f"llama-cpp-python is not installed ({err})", optional="llama_cpp")


def converter_source(missing) -> str:
    """``PHASEINTERP_LLAMA_CPP_SRC``: llama.cpp's source folder with convert_hf_to_gguf.py."""
    src = os.environ.get("PHASEINTERP_LLAMA_CPP_SRC")
    if not src or not (Path(src) / "convert_hf_to_gguf.py").is_file():
        missing(f"PHASEINTERP_LLAMA_CPP_SRC={src!r} does not name llama.cpp's source (with convert_hf_to_gguf.py)")
    return src


def converted_dsv4_fixture(root: Path, src: str) -> tuple[Path, Path]:
    """(release folder, GGUF path) of the DeepSeek-V4 fixture built under ``root`` and converted."""
    for argv in (["fixture", str(root / "fixture")],
                 ["convert", str(root / "fixture" / "release"), str(root / "fixture.gguf"), "--llama-cpp-src", src]):
        done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
    return root / "fixture" / "release", root / "fixture.gguf"
