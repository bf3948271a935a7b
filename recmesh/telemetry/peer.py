"""`server.address`/`server.port` of the peer a client dials: a gRPC target or a Kafka bootstrap list."""

from __future__ import annotations

SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
GRPC_PORT = 443  # gRPC's default for a target without a port
KAFKA_PORT = 9092


def server_attributes(address: str, default_port: int | None = None) -> dict[str, str | int]:
    """`server.address` and `server.port` of the peer a client dials at
    `address`: a gRPC target (`host:port`, `dns:///host:port`, `ipv4:`/`ipv6:`
    lists, `[::1]:port`, `unix:path` with no port) or a Kafka bootstrap list
    (its first server). `default_port` where the address has none."""
    target = address.split(",", 1)[0].strip()
    scheme, _, rest = target.partition(":")
    if scheme in ("unix", "unix-abstract"):
        path = rest.removeprefix("//")
        return {SERVER_ADDRESS: path} if path else {}
    if scheme in ("dns", "ipv4", "ipv6"):
        target = rest[2:].partition("/")[2] if rest.startswith("//") else rest  # dns://authority/host:port
    if target.startswith("["):
        host, _, tail = target[1:].partition("]")
        port_text = tail.removeprefix(":")
    elif target.count(":") == 1:
        host, _, port_text = target.partition(":")
    else:  # a name without a port, or an IPv6 address without brackets
        host, port_text = target, ""
    port = int(port_text) if port_text.isdigit() else default_port
    attributes: dict[str, str | int] = {SERVER_ADDRESS: host} if host else {}
    if host and port is not None:
        attributes[SERVER_PORT] = port
    return attributes
