"""`recmesh events dump` / `features dump-served` copy a whole topic from the
real broker, however it batched the records (the embedded broker reports end
offsets short of its last batches)."""

from __future__ import annotations

import json
from pathlib import Path

from recmesh.demo.live import demo_events
from recmesh.features.served import dump_topic
from recmesh.producer import produce


async def test_a_dump_holds_every_record_of_a_batched_topic(
    kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path
) -> None:
    events = demo_events(3000, seed=7)
    await produce(kafka_bootstrap, topics["events"], events)  # lingered: many records per batch
    out = tmp_path / "log.jsonl"
    assert await dump_topic(kafka_bootstrap, topics["events"], out, timeout_s=30) == len(events)
    dumped = {json.loads(line)["event_id"] for line in out.read_text().splitlines()}
    assert dumped == {e.event_id for e in events}


async def test_a_missing_topic_dumps_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    assert await dump_topic(kafka_bootstrap, "no-such-topic", tmp_path / "x.jsonl", timeout_s=5) == 0
