"""free_port: ports a test or a bench hands to a server it starts."""

from __future__ import annotations

import socket

from recmesh.tools.localinfra import LOWEST_PORT, _ephemeral_range, free_port


def test_free_ports_are_bindable_distinct_and_outside_the_ephemeral_range() -> None:
    low, high = _ephemeral_range()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports), "never the same port twice"
    assert all(LOWEST_PORT <= p < low or p > high for p in ports), (low, high)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[0]))


def test_below_bounds_the_port() -> None:
    assert all(free_port(below=20_000) < 20_000 for _ in range(50))
