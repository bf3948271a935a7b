"""The load generator's keep-alive pool against a real socket server that
closes idle connections, as uvicorn does after its keep-alive timeout."""

from __future__ import annotations

import asyncio

import pytest

from recmesh.tools.bench import loadgen
from recmesh.tools.bench.loadgen import _Pool

ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


async def serve_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer one request, then drop the connection (a keep-alive timeout of zero)."""
    while (line := await reader.readline()) not in (b"\r\n", b""):
        pass
    if line:
        writer.write(ANSWER)
        await writer.drain()
    writer.close()


async def serve_kept_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request on the connection until the client closes it."""
    while True:
        while (line := await reader.readline()) not in (b"\r\n", b""):
            pass
        if not line:
            break
        writer.write(ANSWER)
        await writer.drain()
    writer.close()


async def test_a_connection_the_server_closed_is_retried_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadgen, "IDLE_S", 60.0)  # keep the closed connection in the pool
    server = await asyncio.start_server(serve_then_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = _Pool("127.0.0.1", port, max_conns=4)
    try:
        request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
        assert (await pool.send(request))[0] == 200
        await asyncio.sleep(0.05)  # the server has closed it by now
        assert len(pool._idle) == 1
        assert (await pool.send(request))[0] == 200, "the stale connection is replaced, not an error"
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_connections_idle_past_the_limit_are_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    server = await asyncio.start_server(serve_kept_alive, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = _Pool("127.0.0.1", port, max_conns=4)
    request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
    try:
        await pool.send(request)
        first = pool._idle[0]
        await pool.send(request)
        assert pool._idle == [first], "a connection the server keeps open is reused"
        monkeypatch.setattr(loadgen, "IDLE_S", 0.0)
        await pool.send(request)
        assert pool._idle[0] is not first and first.writer.is_closing(), "idle past the limit: a new one"
    finally:
        pool.close()
        server.close()
        await server.wait_closed()
