"""Structured logs: structlog JSON lines carrying service, trace_id and span_id."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import orjson
import structlog
from opentelemetry import trace


def _add_trace_ids(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event["trace_id"] = format(ctx.trace_id, "032x")
        event["span_id"] = format(ctx.span_id, "016x")
    return event


def _json_line(obj: Any, **_: Any) -> str:
    # A log call must never raise: int dict keys become strings, unknown objects their str().
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, default=str).decode()


def process_age_s() -> float | None:
    """Seconds since this process was created (Linux: /proc/self/stat, 10 ms
    ticks), so a cold-start figure includes interpreter start and imports;
    None where /proc is not available."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(after_name[19])  # field 22, starttime (fields 1-2 precede the split)
    except (OSError, ValueError, IndexError):
        return None
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")


def setup_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_json_line)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_trace_ids,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
