"""Build a natural-code corpus from the Python source on this machine: the standard library and the
installed site-packages of the interpreter that runs the script.

    python benchmarks/python_source_corpus.py --out ~/phaseinterp-runs/corpus/python-source.jsonl [--max-mb 160]

One JSONL record ({"text": ..., "source": "stdlib/json/decoder.py"}) per ``.py`` file. Documents are
deduplicated by content (the same module installed twice, vendored copies, empty ``__init__.py``
files count once); files under 200 characters, over ``--max-file-kb`` (generated tables) or not
UTF-8 are left out. Roots and files are read in sorted order, so the same installation gives the
same corpus; the counts per root are printed and written beside the corpus (``.manifest.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import site
import sys
import sysconfig
from pathlib import Path


def roots() -> list[tuple[str, Path]]:
    """(name, folder) of the standard library, then this environment's site-packages, then the base
    interpreter's (a venv's packages first; the stdlib walk leaves out every site-packages folder)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    found = [("stdlib", stdlib)]
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})["purelib"]
    for i, folder in enumerate(dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"], base])):
        path = Path(folder).resolve()
        if path.is_dir() and path not in {p for _, p in found}:
            found.append((f"site{i}", path))
    return found


def python_files(root: Path, skip: set[Path]):
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if (here / d).resolve() not in skip and not d.startswith(".")
                         and not (root.name != "site-packages" and d in ("site-packages", "dist-packages")))
        for name in sorted(files):
            if name.endswith(".py") and not (here / name).is_symlink():
                yield here / name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-mb", type=float, default=160.0)
    parser.add_argument("--max-file-kb", type=float, default=256.0)
    args = parser.parse_args(argv)
    out = Path(os.path.expanduser(args.out))
    if out.exists():
        print(f"--out {out} exists; pass a new path", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    budget, limit = int(args.max_mb * 2**20), int(args.max_file_kb * 1024)
    folders = roots()
    nested = {path for _, path in folders[1:]}  # site-packages folders are their own roots
    hashes: set[str] = set()
    counts: dict[str, dict[str, int]] = {}
    total = 0
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for name, root in folders:
            c = counts.setdefault(name, {"files": 0, "kept": 0, "duplicates": 0, "chars": 0})
            for path in python_files(root, nested - {root}):
                c["files"] += 1
                try:
                    raw = path.read_bytes()
                    text = raw.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if len(text.strip()) < 200 or len(raw) > limit:
                    continue
                digest = hashlib.sha256(raw).hexdigest()
                if digest in hashes:
                    c["duplicates"] += 1
                    continue
                hashes.add(digest)
                f.write(json.dumps({"text": text, "source": f"{name}/{path.relative_to(root)}"}) + "\n")
                c["kept"] += 1
                c["chars"] += len(text)
                total += len(text)
                if total >= budget:
                    break
            if total >= budget:
                break
    os.replace(tmp, out)
    manifest = {"roots": {name: str(path) for name, path in folders}, "counts": counts,
                "documents": len(hashes), "chars": total, "python": sys.version.split()[0],
                "max_mb": args.max_mb, "max_file_kb": args.max_file_kb}
    out.with_name(out.name + ".manifest.json").write_text(json.dumps(manifest, indent=2))
    for name, c in counts.items():
        print(f"{name}: {c['files']} .py files, {c['kept']} kept, {c['duplicates']} duplicates, "
              f"{c['chars'] / 2**20:.1f} MiB")
    print(f"{out}: {len(hashes)} documents, {total / 2**20:.1f} MiB of text")
    return 0


if __name__ == "__main__":
    sys.exit(main())
