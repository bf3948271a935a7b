"""`recmesh events dump` / `features dump-served` copy a whole topic from the
real broker, however it batched the records (the embedded broker reports end
offsets short of its last batches)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from recmesh.errors import NotFound
from recmesh.features.served import dump_topic
from recmesh.producer import produce_events
from recmesh.tools.cli.main import main
from recmesh.tools.demo.live import demo_events


async def test_a_dump_holds_every_record_of_a_batched_topic(
    kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path
) -> None:
    events = demo_events(3000, seed=7)
    await produce_events(kafka_bootstrap, topics["events"], events)  # lingered: many records per batch
    out = tmp_path / "log.jsonl"
    dump = await dump_topic(kafka_bootstrap, topics["events"], out, timeout_s=30)
    assert (dump.written, dump.skipped) == (len(events), 0)
    dumped = {json.loads(line)["event_id"] for line in out.read_text().splitlines()}
    assert dumped == {e.event_id for e in events}


async def test_an_events_dump_leaves_out_what_the_ingest_dead_letters(
    kafka_bootstrap: str,
    topics: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP", kafka_bootstrap)
    good = demo_events(20, seed=3)
    await produce_events(kafka_bootstrap, topics["events"], good)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topics["events"], b"{not json")
    finally:
        await producer.stop()
    out = tmp_path / "log.jsonl"
    code = await asyncio.to_thread(
        main, ["events", "dump", "--out", str(out), "--topic", topics["events"], "--timeout", "20"]
    )
    assert code == 0
    said = capsys.readouterr().out
    assert f"wrote {len(good)} events" in said and "left out 1 malformed" in said
    assert len(out.read_text().splitlines()) == len(good)


async def test_a_missing_topic_is_not_found(kafka_bootstrap: str, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no-such-topic"):
        await dump_topic(kafka_bootstrap, "no-such-topic", tmp_path / "x.jsonl", timeout_s=5)
