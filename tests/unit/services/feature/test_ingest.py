from __future__ import annotations

from services.feature.ingest import Watermarks


def test_lateness_rule_per_partition() -> None:
    w = Watermarks(allowed_lateness_ms=10_000, retention_ms=3_600_000)
    assert w.judge(0, 100_000_000) == "on_time"
    assert w.judge(0, 100_000_000 - 10_000) == "on_time"  # exactly at the allowed lateness
    assert w.judge(0, 100_000_000 - 10_001) == "late"  # applied, counted
    assert w.judge(0, 100_000_000 - 3_600_001) == "too_late"  # older than retained state
    assert w.judge(1, 1_000) == "on_time", "partitions have their own watermark"
    assert w.judge(0, 100_000_500) == "on_time"
    assert w.judge(0, 100_000_000 - 9_600) == "late", "the watermark moved forward"
