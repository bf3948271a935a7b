"""The alert rules fire as the design notes say: promtool evaluates
deploy/prometheus/alerts.yml against the synthetic series in
deploy/prometheus/tests/alerts_test.yml (state drift, class-A p95, breakers)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[3] / "deploy" / "prometheus" / "tests" / "alerts_test.yml"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *args], cwd=TESTS.parent, capture_output=True, text=True, timeout=60, check=False
    )


def test_alert_rules_fire_at_the_design_notes_thresholds() -> None:
    result = _run("test", "rules", TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_rules_file_is_valid_prometheus() -> None:
    result = _run("check", "rules", "../alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
