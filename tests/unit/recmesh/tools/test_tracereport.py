from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from recmesh.tools.tracereport import Report, attribute, load_spans, main, render, self_times, to_json

MS = 1_000_000


def span(
    trace: str,
    sid: str,
    parent: str | None,
    service: str,
    start_ms: float,
    end_ms: float,
    kind: str = "INTERNAL",
    name: str = "op",
    **attributes: Any,
) -> dict[str, Any]:
    return {
        "name": name,
        "service": service,
        "trace_id": trace,
        "span_id": sid,
        "parent_id": parent,
        "kind": kind,
        "start_ns": int(start_ms * MS),
        "end_ns": int(end_ms * MS),
        "status": "UNSET",
        "attributes": attributes,
    }


def write(tmp_path: Path, spans: list[dict[str, Any]], name: str = "spans.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(s) + "\n" for s in spans))
    return path


def report_for(tmp_path: Path, spans: list[dict[str, Any]], slo_class: str | None = None) -> Report:
    return attribute(load_spans([write(tmp_path, spans)]), slo_class)


def by_component(report: Report) -> dict[str, float]:
    return {c.component: c.p50_ms for c in report.components}


def test_self_time_subtracts_the_union_of_nested_and_overlapping_children(tmp_path: Path) -> None:
    spans = [
        span("t", "a", None, "recmesh-gateway", 0, 100, "SERVER"),
        span("t", "b", "a", "recmesh-ranker", 10, 40),
        span("t", "c", "a", "recmesh-ranker", 30, 60),  # overlaps b: A's children cover [10, 60]
        span("t", "d", "a", "recmesh-gateway", 90, 120),  # outlives A: clipped to [90, 100]
        span("t", "e", "b", "recmesh-feature", 15, 20, "CLIENT", "GET", **{"db.system": "redis"}),
    ]
    loaded = load_spans([write(tmp_path, spans)])
    # a: 100 - 60 = 40, d: 30 (no children) -> gateway 70; b: 30 - 5 = 25, c: 30 -> ranker 55
    unclipped = self_times(loaded, clip=False)
    assert {k: v / MS for k, v in unclipped.items()} == {"gateway": 70, "ranker": 55, "redis": 5}
    report = attribute(loaded)
    assert report.traces == 1 and report.e2e_p50_ms == pytest.approx(100)
    # Clipped to its parent, d counts only for [90, 100]: gateway 40 + 10.
    assert by_component(report) == pytest.approx({"gateway": 50, "ranker": 55, "redis": 5})


@pytest.mark.parametrize(("k_start", "k_end"), [(150, 155), (62, 70), (55, 65)])
def test_work_beside_the_request_is_not_its_latency(tmp_path: Path, k_start: float, k_end: float) -> None:
    spans = [
        span("t", "a", None, "recmesh-gateway", 0, 100, "SERVER"),
        span("t", "b", "a", "recmesh-feature", 10, 60, "SERVER"),
        # The served-feature log's send, a child of the look-up that runs after
        # it: after the answer, while the request goes on, or across its end.
        span(
            "t",
            "k",
            "b",
            "recmesh-feature",
            k_start,
            k_end,
            "PRODUCER",
            "send served_features",
            **{"messaging.system": "kafka", "messaging.operation.type": "send"},
        ),
    ]
    components = by_component(report_for(tmp_path, spans))
    assert sum(components.values()) == pytest.approx(100), "the components add up to the request"
    assert components["gateway"] == pytest.approx(50)
    assert components.get("kafka", 0) == pytest.approx(max(0, min(k_end, 60) - k_start))


@pytest.mark.parametrize("system", ["db.system", "db.system.name"])
def test_redis_by_the_old_or_the_stable_database_conventions(tmp_path: Path, system: str) -> None:
    """OTEL_SEMCONV_STABILITY_OPT_IN=database renames db.system to db.system.name."""
    spans = [
        span("t", "a", None, "recmesh-feature", 0, 10, "SERVER"),
        span("t", "r", "a", "recmesh-feature", 2, 6, "CLIENT", "HGETALL", **{system: "redis"}),
    ]
    assert by_component(report_for(tmp_path, spans)) == pytest.approx({"feature": 6, "redis": 4})


def test_client_time_outside_the_callee_server_span_is_network(tmp_path: Path) -> None:
    spans = [
        span("t", "g", None, "recmesh-gateway", 0, 100, "SERVER"),
        span("t", "gc", "g", "recmesh-gateway", 10, 90, "CLIENT"),
        span("t", "rs", "gc", "recmesh-ranker", 15, 85, "SERVER"),
        span("t", "rc", "rs", "recmesh-ranker", 20, 60, "CLIENT"),
        span("t", "fs", "rc", "recmesh-feature", 25, 55, "SERVER"),
        span("t", "redis", "fs", "recmesh-feature", 30, 40, "CLIENT", "HGETALL", **{"db.system": "redis"}),
        span("t", "fc", "fs", "recmesh-feature", 41, 51, "CLIENT"),  # same service: stays "feature"
        span("t", "fs2", "fc", "recmesh-feature", 42, 50, "SERVER"),
        span("t", "rc2", "rs", "recmesh-ranker", 60, 70, "CLIENT"),  # callee not collected: "ranker"
    ]
    shares = {c.component: c.share for c in report_for(tmp_path, spans).components}
    assert shares == pytest.approx(
        {
            "gateway": 0.20,
            "network:ranker": 0.10,  # 80 ms client - 70 ms ranker server
            "ranker": 0.30,  # 70 - union(20..60, 60..70) + 10 ms uninstrumented call
            "network:feature": 0.10,
            "feature": 0.20,  # 30 - 10 - 10 + 2 (loopback client) + 8 (its server)
            "redis": 0.10,
        }
    )


def test_slo_class_filter_uses_the_root_class_then_any_span(tmp_path: Path) -> None:
    spans = [
        span("t1", "r", None, "recmesh-gateway", 0, 10, "SERVER", **{"recmesh.slo_class": "A"}),
        span("t2", "r", None, "recmesh-gateway", 0, 20, "SERVER"),
        span("t2", "s", "r", "recmesh-ranker", 2, 18, "SERVER", **{"recmesh.slo_class": "B"}),
        span("t3", "r", None, "recmesh-gateway", 0, 30, "SERVER", **{"recmesh.slo_class": "B"}),
        span("t3", "s", "r", "recmesh-ranker", 2, 28, "SERVER", **{"recmesh.slo_class": "A"}),
    ]
    loaded = load_spans([write(tmp_path, spans)])
    assert attribute(loaded).traces == 3
    only_a = attribute(loaded, "A")
    assert only_a.traces == 1 and only_a.e2e_p50_ms == pytest.approx(10)
    only_b = attribute(loaded, "b")
    assert only_b.traces == 2 and only_b.e2e_mean_ms == pytest.approx(25)
    assert attribute(loaded, "C").traces == 0


def test_percentiles_and_shares_on_a_hand_computed_example(tmp_path: Path) -> None:
    spans: list[dict[str, Any]] = []
    # (end-to-end, ranker, feature or None) per trace; gateway keeps the rest
    for i, (e2e, ranker, feature) in enumerate([(10, 4, 2), (20, 10, 6), (30, 20, None), (40, 30, None)]):
        t = f"t{i}"
        spans.append(span(t, "g", None, "recmesh-gateway", 0, e2e, "SERVER"))
        spans.append(span(t, "r", "g", "recmesh-ranker", 0, ranker))
        if feature is not None:
            spans.append(span(t, "f", "g", "recmesh-feature", ranker, ranker + feature))
    report = report_for(tmp_path, spans)
    assert report.traces == 4
    # Nearest rank (recmesh.stats): over four traces p50 is the 2nd, p95 and p99 the 4th.
    assert (report.e2e_p50_ms, report.e2e_p95_ms, report.e2e_p99_ms) == pytest.approx((20, 40, 40))
    assert report.e2e_mean_ms == pytest.approx(25)
    stats = {c.component: c for c in report.components}
    assert [c.component for c in report.components] == ["ranker", "gateway", "feature"]
    assert (stats["ranker"].traces, stats["ranker"].p50_ms, stats["ranker"].p95_ms) == pytest.approx(
        (4, 10, 30)
    )
    assert stats["ranker"].share == pytest.approx(16 / 25)
    assert (stats["gateway"].p50_ms, stats["gateway"].p95_ms) == pytest.approx((4, 10))
    assert stats["gateway"].share == pytest.approx(7 / 25)
    # feature appears in 2 traces: percentiles over those, share over all four
    assert stats["feature"].traces == 2
    assert (stats["feature"].p50_ms, stats["feature"].p95_ms) == pytest.approx((2, 6))
    assert stats["feature"].share == pytest.approx(2 / 25)
    assert sum(c.share for c in report.components) == pytest.approx(1.0)


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    good = json.dumps(span("t", "a", None, "recmesh-gateway", 0, 1))
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{good}\n\n{{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3"):
        load_spans([path])
    missing = {k: v for k, v in span("t", "a", None, "recmesh-gateway", 0, 1).items() if k != "end_ns"}
    path.write_text(f"{good}\n{json.dumps(missing)}\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: .*end_ns"):
        load_spans([path])


def test_blank_lines_are_skipped_and_files_are_combined(tmp_path: Path) -> None:
    gateway = write(tmp_path, [span("t", "g", None, "recmesh-gateway", 0, 10, "SERVER")], "gw.jsonl")
    ranker = tmp_path / "ranker.jsonl"
    ranker.write_text("\n" + json.dumps(span("t", "r", "g", "recmesh-ranker", 2, 8, "SERVER")) + "\n  \n")
    spans = load_spans([gateway, ranker])
    assert [s.service for s in spans] == ["recmesh-gateway", "recmesh-ranker"]
    assert spans[1].parent_id == "g" and spans[1].duration_ns == 6 * MS
    assert by_component(attribute(spans)) == pytest.approx({"gateway": 4, "ranker": 6})


def test_traces_without_a_root_are_skipped(tmp_path: Path) -> None:
    spans = [
        # root span never collected: two orphans under the same missing parent
        span("lost", "x", "gone", "recmesh-gateway", 0, 5),
        span("lost", "y", "gone", "recmesh-ranker", 5, 9, "CLIENT"),
        # a root whose parent is an external caller's span still counts
        span("ok", "g", "external", "recmesh-gateway", 0, 10, "SERVER"),
        span("ok", "r", "g", "recmesh-ranker", 1, 4),
    ]
    report = report_for(tmp_path, spans)
    assert (report.traces, report.skipped_traces) == (1, 1)
    assert by_component(report) == pytest.approx({"gateway": 7, "ranker": 3})


def test_render_and_to_json_include_every_component(tmp_path: Path) -> None:
    spans = [
        span("t", "g", None, "recmesh-gateway", 0, 100, "SERVER"),
        span("t", "gc", "g", "recmesh-gateway", 10, 90, "CLIENT"),
        span("t", "rs", "gc", "recmesh-ranker", 15, 85, "SERVER"),
        span("t", "rec", "rs", "recmesh-ranker", 16, 20, name="recall"),
        span("t", "ic", "rs", "recmesh-ranker", 20, 60, "CLIENT"),
        span("t", "is", "ic", "recmesh-inference", 22, 58, "SERVER"),
        span("t", "fr", "rs", "recmesh-feature", 60, 70, "CLIENT", **{"db.system": "redis"}),
    ]
    report = report_for(tmp_path, spans)
    names = {c.component for c in report.components}
    assert names == {"gateway", "network:ranker", "ranker", "network:inference", "inference", "redis"}
    text = render(report)
    lines = text.splitlines()
    assert lines[0].split() == ["component", "traces", "p50", "ms", "p95", "ms", "share", "%"]
    body = [line.split()[0] for line in lines[2 : 2 + len(names)]]
    assert body == [c.component for c in report.components]
    assert set(body) == names
    assert any(line.startswith("end-to-end") and "100.000" in line for line in lines)
    doc = to_json(report)
    assert {c["component"] for c in doc["components"]} == names
    assert doc["traces"] == 1 and doc["end_to_end"]["p99_ms"] == pytest.approx(100)
    assert json.loads(json.dumps(doc)) == doc


def test_main_prints_the_table_and_json_last(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, [span("t", "g", None, "recmesh-gateway", 0, 10, "SERVER")])
    assert main(argparse.Namespace(files=[str(path)], slo_class=None, json=True)) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("component")
    assert json.loads(out[-1])["components"][0]["component"] == "gateway"
    assert main(argparse.Namespace(files=[str(path)], slo_class=None, json=False)) == 0
    assert "{" not in capsys.readouterr().out


def test_main_fails_clearly_without_a_complete_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, [span("t", "g", None, "recmesh-gateway", 0, 10, "SERVER")])
    assert main(argparse.Namespace(files=[str(path)], slo_class="A", json=False)) == 1
    captured = capsys.readouterr()
    assert "no complete trace of SLO class A" in captured.err and captured.out == ""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[]\n")
    assert main(argparse.Namespace(files=[str(bad)], slo_class=None, json=False)) == 1
    assert "bad.jsonl:1" in capsys.readouterr().err
