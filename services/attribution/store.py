"""Attribution's state in Redis: answers not yet final, positive events, the clock, the sums.

Per user (under the user's hash tag, recmesh.features.keys): each answer not
yet final (`impression`, a compact copy: ids, scores, group, shadow scores),
the index of them by as-of time (`user_impressions`), and the user's positive
events (`user_positives`, one member per event id). Under `{eval}`: what is
pending, by due time (as-of + window); the clock (newest time read per topic
partition); per minute of as-of time the sums (recmesh/evaluation/sums.py) and
the ids already added.

Every write is idempotent, so a redelivered batch changes nothing: an answer
is stored once (SET NX; pending again is harmless), a positive event is one
member per event id, and an answer's sums are added only by the script that
first puts its id in the minute's `done` set, atomically. Figures are computed
only when an answer is final, from what the store holds then, so they do not
depend on the order the two topics were read in.

Cost: an answer not yet final holds about 60 bytes plus 20 per item shown
(its copy and two sorted-set members) for window + lateness; a positive event
one member (~60 bytes) for window + lateness + grace; a final answer's id ~70
bytes for the grace; each minute's sums ~40 fields per group, for the retention.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
from redis.exceptions import NoScriptError

from recmesh.evaluation.impression import Group, Shadow, Shown
from recmesh.evaluation.outcome import Positive, Touch
from recmesh.evaluation.sums import add
from recmesh.features import keys
from recmesh.features.repository import Evaluation
from recmesh.redis_client import AnyRedis

MINUTE_MS = 60_000

# KEYS: the answer, the user's answers. ARGV: its copy, as-of, TTL ms, request id, trim before.
_STORE_ANSWER_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3]) then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return 1
end
return 0
"""

# KEYS: the user's positives. ARGV: TTL ms, trim before, then member, time pairs.
_STORE_POSITIVES_LUA = """
for i = 3, #ARGV, 2 do redis.call('ZADD', KEYS[1], ARGV[i + 1], ARGV[i]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

# KEYS: the answer, the user's answers, the user's positives. ARGV: the user's
# answer-key prefix, window ms. -> {copy or false, {rid, as-of, copy}..., {member, time}...}
_READ_ANSWER_LUA = """
local copy = redis.call('GET', KEYS[1])
if not copy then return {false, {}, {}} end
local as_of = tonumber(cjson.decode(copy)[3])
local last = as_of + tonumber(ARGV[2])
local others = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], as_of, last, 'WITHSCORES')
for i = 1, #ids, 2 do
  local other = redis.call('GET', ARGV[1] .. ids[i])
  if other then table.insert(others, {ids[i], ids[i + 1], other}) end
end
return {copy, others, redis.call('ZRANGEBYSCORE', KEYS[3], as_of, last, 'WITHSCORES')}
"""

# KEYS: the minute's done set, its sums, all-time sums, pending, the bucket index.
# ARGV: request id, pending member, done TTL ms, sums TTL ms, bucket, then field, amount pairs.
_FINALISE_LUA = """
redis.call('ZREM', KEYS[4], ARGV[2])
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
for i = 6, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i], ARGV[i + 1])
  redis.call('HINCRBYFLOAT', KEYS[3], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[5], ARGV[5], ARGV[5])
return 1
"""


_SCRIPTS = (_STORE_ANSWER_LUA, _STORE_POSITIVES_LUA, _READ_ANSWER_LUA, _FINALISE_LUA)


def pack(shown: Shown) -> bytes:
    """The compact copy kept until the answer is final (the read script reads its as-of, [3])."""
    g, sh = shown.group, shown.shadow
    return orjson.dumps([
        shown.request_id, shown.user_id, shown.as_of_ms, shown.items, shown.scores,
        [g.model_version, g.ladder, g.slo_class, g.arm],
        None if sh is None else [sh.model_version, sh.scores],
    ])  # fmt: skip


def unpack(raw: bytes) -> Shown:
    rid, user, as_of, items, scores, group, shadow = orjson.loads(raw)
    sh = None if shadow is None else Shadow(shadow[0], tuple(shadow[1]))
    return Shown(rid, user, as_of, tuple(items), tuple(scores), Group(*group), sh)


def pending_member(user_id: str, request_id: str) -> str:
    return f"{user_id}|{request_id}"  # user ids carry no "|" (recmesh.events)


@dataclass(frozen=True)
class Due:
    """An answer whose figures are due, with what credits it."""

    member: str
    shown: Shown | None  # None: its copy expired before it was final
    others: list[Touch]
    positives: list[Positive]


class AttributionStore:
    def __init__(self, client: AnyRedis, evaluation: Evaluation, grace_ms: int, retention_ms: int) -> None:
        self.client = client
        self.evaluation = evaluation
        self._span_ms = evaluation.window_ms + evaluation.lateness_ms
        self._grace_ms = grace_ms
        self._retention_ms = retention_ms
        self._sha: dict[str, str] = {}  # script -> its SHA1 once loaded

    async def _run(self, fill: Callable[[Any, Callable[..., None]], None]) -> list[Any]:
        """One pipeline (`fill(pipe, call)`: `call(script, keys, args)` adds a script
        call by its SHA1); the scripts are loaded first, and again if the server lost them."""
        for attempt in (0, 1):
            if attempt or not self._sha:
                for script in _SCRIPTS:
                    self._sha[script] = str(await self.client.script_load(script))
            pipe = self.client.pipeline(transaction=False)

            def call(script: str, keys: Sequence[str], args: Sequence[object], pipe: Any = pipe) -> None:
                pipe.evalsha(self._sha[script], len(keys), *keys, *args)

            fill(pipe, call)
            try:
                return list(await pipe.execute())
            except NoScriptError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def write(self, shown: Sequence[Shown], positives: dict[str, list[Positive]]) -> None:
        """Store answers and positive events (idempotent: see the module docstring)."""
        keep_ms = self._span_ms + self._grace_ms

        def fill(pipe: Any, call: Callable[..., None]) -> None:
            for s in shown:
                call(
                    _STORE_ANSWER_LUA,
                    [keys.impression(s.user_id, s.request_id), keys.user_impressions(s.user_id)],
                    [pack(s), s.as_of_ms, keep_ms, s.request_id, s.as_of_ms - keep_ms],
                )
                due = s.as_of_ms + self.evaluation.window_ms  # final once the clock passes it + lateness
                pipe.zadd(keys.EVAL_PENDING, {pending_member(s.user_id, s.request_id): due})
            for user, events in positives.items():
                newest = max(p.event_time for p in events)
                pairs = [x for p in events for x in (p.member(), p.event_time)]
                call(_STORE_POSITIVES_LUA, [keys.user_positives(user)], [keep_ms, newest - keep_ms, *pairs])

        if shown or positives:
            await self._run(fill)

    async def advance(self, marks: dict[str, int]) -> None:
        """Record the newest time read per "<topic>:<partition>" (never moved back by the caller)."""
        now = int(time.time() * 1000)
        if marks:
            await self.client.hset(keys.EVAL_CLOCK, mapping={k: f"{t}:{now}" for k, t in marks.items()})

    async def clock(self, idle_ms: int, now_ms: int | None = None) -> int | None:
        """Attribution's event-time clock: the oldest newest-time of the partitions still
        bringing records (one that brought nothing for `idle_ms` no longer holds it back);
        when all are idle, the newest time read plus the wall time since. None: nothing read."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        raw = await self.client.hgetall(keys.EVAL_CLOCK)
        marks = [tuple(int(x) for x in v.decode().split(":")) for v in cast(dict[bytes, bytes], raw).values()]
        if not marks:
            return None
        active = [t for t, wall in marks if now - wall < idle_ms]
        if active:
            return min(active)
        last_read = max(wall for _, wall in marks)
        return max(t for t, _ in marks) + (now - last_read)

    async def due(self, clock_ms: int, limit: int) -> list[Due]:
        """Answers whose window and lateness have passed on the clock, oldest first."""
        members = await self.client.zrangebyscore(
            keys.EVAL_PENDING, "-inf", clock_ms - self.evaluation.lateness_ms, start=0, num=limit
        )
        if not members:
            return []
        names = [m.decode() for m in cast(list[bytes], members)]

        def fill(pipe: Any, call: Callable[..., None]) -> None:
            for name in names:
                user, rid = name.split("|", 1)
                call(
                    _READ_ANSWER_LUA,
                    [keys.impression(user, rid), keys.user_impressions(user), keys.user_positives(user)],
                    [keys.impression_prefix(user), self.evaluation.window_ms],
                )

        out = []
        for name, (copy, others, positives) in zip(names, await self._run(fill), strict=True):
            if not copy:
                out.append(Due(name, None, [], []))
                continue
            touches = [Touch(o[0].decode(), int(float(o[1])), frozenset(unpack(o[2]).items)) for o in others]
            pos = [
                Positive.from_member(positives[i].decode(), int(float(positives[i + 1])))
                for i in range(0, len(positives), 2)
            ]
            out.append(Due(name, unpack(copy), touches, pos))
        return out

    async def finalise(self, done: Sequence[tuple[Due, list[tuple[str, float]]]]) -> list[bool]:
        """Add each answer's sums, once (True where this call added them), and forget it."""

        def fill(pipe: Any, call: Callable[..., None]) -> None:
            for due, fields in done:
                if due.shown is None:
                    pipe.zrem(keys.EVAL_PENDING, due.member)
                    continue
                s = due.shown
                bucket = s.as_of_ms // MINUTE_MS
                call(
                    _FINALISE_LUA,
                    [keys.eval_done(bucket), keys.eval_sums(bucket), keys.EVAL_TOTAL, keys.EVAL_PENDING,
                     keys.EVAL_BUCKETS],
                    [s.request_id, due.member, self._span_ms + self._grace_ms, self._retention_ms, bucket,
                     *(x for f, v in fields for x in (f, repr(v)))],
                )  # fmt: skip
                pipe.delete(keys.impression(s.user_id, s.request_id))
                pipe.zrem(keys.user_impressions(s.user_id), s.request_id)

        replies = await self._run(fill)
        added, i = [], 0
        for due, _ in done:
            if due.shown is None:
                added.append(False)
                i += 1
            else:
                added.append(replies[i] == 1)
                i += 3
        return added

    async def pending(self) -> int:
        return int(await self.client.zcard(keys.EVAL_PENDING))


async def read_minutes(
    client: AnyRedis, first: int | str = "-inf", last: int | str = "+inf"
) -> list[tuple[int, dict[str, float]]]:
    """Each minute of as-of time from `first` to `last` holding sums, oldest first, with
    its sums; a minute past the retention has expired and holds none."""
    minutes = sorted(
        int(b) for b in cast(list[bytes], await client.zrangebyscore(keys.EVAL_BUCKETS, first, last))
    )
    if not minutes:
        return []
    pipe = client.pipeline(transaction=False)
    for m in minutes:
        pipe.hgetall(keys.eval_sums(m))
    parts = cast(list[dict[bytes, bytes]], await pipe.execute())
    return [
        (m, {k.decode(): float(v) for k, v in part.items()}) for m, part in zip(minutes, parts, strict=True)
    ]


def _total(minutes: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for _, part in minutes:
        add(sums, part)
    return sums


async def read_sums(client: AnyRedis, window_ms: int | None) -> tuple[dict[str, float], int | None]:
    """The sums of the newest `window_ms` of as-of time (None: every answer ever
    finalised), and the newest minute holding any (None: none)."""
    newest = cast(list[bytes], await client.zrevrange(keys.EVAL_BUCKETS, 0, 0))
    last = int(newest[0]) if newest else None
    if window_ms is None:
        raw = cast(dict[bytes, bytes], await client.hgetall(keys.EVAL_TOTAL))
        return {k.decode(): float(v) for k, v in raw.items()}, last
    if last is None:
        return {}, None
    return _total(await read_minutes(client, last - max(1, window_ms // MINUTE_MS) + 1, last)), last


async def read_sums_since(client: AnyRedis, first_minute: int) -> dict[str, float]:
    """The sums of every minute of as-of time from `first_minute` on (the guard: an
    experiment's minutes)."""
    return _total(await read_minutes(client, first_minute))
