"""The committed generated code must equal what `make proto` produces."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_proto.py"), str(tmp_path)], check=True)
    generated = sorted(p.name for p in (tmp_path / "recmesh" / "v1").iterdir())
    committed = sorted(p.name for p in (ROOT / "recmesh" / "v1").iterdir() if "_pb2" in p.name)
    assert generated == committed, "run `make proto` and commit the result"
    stale = [
        n
        for n in generated
        if not filecmp.cmp(tmp_path / "recmesh" / "v1" / n, ROOT / "recmesh" / "v1" / n, shallow=False)
    ]
    assert not stale, f"stale generated files {stale}: run `make proto`"
