"""Build a natural-text corpus from the English documentation Debian installs under /usr/share/doc.

    python benchmarks/debian_docs_corpus.py --out runs/corpus/debian-docs.jsonl [--max-mb 60]

One JSONL record ({"text": ..., "source": path}) per file: README, NEWS, upstream changelogs, .txt,
.md and .rst files, gzip-compressed ones decompressed. Left out: copyright files (one licence text
repeated hundreds of times) and Debian packaging changelogs (changelog.Debian*). Each file is cut
at --max-file-kb, the corpus at --max-mb; files are read in sorted order, so the same machine
image gives the same corpus.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

ROOT = Path("/usr/share/doc")
NAMES = ("README", "NEWS", "changelog", "CHANGES", "HISTORY", "FAQ", "TODO", "AUTHORS", "THANKS", "BUGS")
SUFFIXES = (".txt", ".md", ".rst")


def wanted(path: Path) -> bool:
    name = path.name
    if name == "copyright" or name.startswith("changelog.Debian"):
        return False
    stem = name[:-3] if name.endswith(".gz") else name
    return stem.endswith(SUFFIXES) or any(stem.startswith(n) for n in NAMES)


def read(path: Path, limit: int) -> str:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read(limit)
    except (OSError, EOFError):
        return ""
    text = raw.decode("utf-8", errors="replace")
    printable = sum(ch.isprintable() or ch in "\n\t" for ch in text[:4000])
    return text if text and printable / min(len(text), 4000) > 0.97 else ""  # skips binaries


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-mb", type=float, default=60.0)
    parser.add_argument("--max-file-kb", type=float, default=512.0)
    args = parser.parse_args(argv)
    if not ROOT.is_dir():
        print(f"{ROOT} does not exist on this machine", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists():
        print(f"--out {out} exists; pass a new path", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    budget, total, n = int(args.max_mb * 2**20), 0, 0
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for root, dirs, files in os.walk(ROOT):
            dirs.sort()
            for name in sorted(files):
                path = Path(root) / name
                if path.is_symlink() or not wanted(path):
                    continue
                text = read(path, int(args.max_file_kb * 1024))
                if len(text.strip()) < 200:
                    continue
                f.write(json.dumps({"text": text, "source": str(path)}) + "\n")
                total += len(text)
                n += 1
                if total >= budget:
                    break
            if total >= budget:
                break
    os.replace(tmp, out)
    print(f"{out}: {n} documents, {total / 2**20:.1f} MiB of text")
    return 0


if __name__ == "__main__":
    sys.exit(main())
