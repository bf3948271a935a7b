"""Sampling profiles of the mesh's processes while a bench loads them (py-spy).

`recmesh bench e2e --profile DIR` records every service process of the mesh
it measures with py-spy (a dev dependency: an out-of-process sampler, so the
services run unmodified) for the whole sweep, and writes, per process,
DIR/NAME.folded (collapsed stacks: `frame;frame;... count`, the input of
flamegraph.pl or speedscope) and a summary of the top frames: by own time
(the frame at the top of the stack: where the CPU went) and by total time
(the frame anywhere on the stack: what the work was for).

Samples are taken at `rate` per second with `--nonblocking` (the process is
not paused to read its stack, so it runs at its own speed; a rare torn stack
is the price) and only of threads that are running (py-spy leaves idle ones
out), so the shares are of the process's busy time.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from recmesh.errors import FailedPrecondition


def py_spy() -> str:
    """The py-spy executable: beside this Python (a virtual environment run without
    activating it), else on PATH; or a clear error (the dev extra installs it)."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise FailedPrecondition("--profile needs py-spy: pip install -e '.[dev]' (or pip install py-spy)")
    return found


@contextlib.asynccontextmanager
async def recording(pids: Mapping[str, int], out_dir: Path, rate: int = 100) -> AsyncIterator[None]:
    """py-spy on each named process while the block runs; DIR/NAME.folded when it ends."""
    exe = py_spy()
    await asyncio.to_thread(out_dir.mkdir, parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, pid in pids.items():
            out = str(out_dir / f"{name}.folded")
            cmd = [exe, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking",
                   "--full-filenames", "--format", "raw", "--output", out]  # fmt: skip
            log = (out_dir / f"{name}.py-spy.log").open("wb")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))  # noqa: ASYNC220
            log.close()
        await asyncio.sleep(0.5)  # py-spy attaches
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for proc in procs:
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.kill()


@dataclass(frozen=True)
class Frames:
    samples: int
    own: list[tuple[str, float]]  # (frame, share of samples) where the CPU went
    total: list[tuple[str, float]]  # (our frame, share of samples with it anywhere on the stack)


PROJECT = ("services/", "recmesh/")  # total time is shown for our own frames only
# Recorded with --full-filenames (py-spy's own shortening writes services/ranker/pipeline.py
# as ranker/pipeline.py, indistinguishable from a library's): paths are shown relative to the
# longest of these that holds them (this Python's libraries, then this checkout).
_CHECKOUT = str(Path(__file__).resolve().parents[3])
ROOTS = tuple(
    sorted({_CHECKOUT, sysconfig.get_paths()["stdlib"], *site.getsitepackages()}, key=len, reverse=True)
)


def _frame(raw: str, roots: tuple[str, ...] = ROOTS) -> str:
    """`handle (/checkout/services/ranker/server.py:88)` -> `handle (services/ranker/server.py)`:
    lines apart, one function is one row; a path relative to its root (another checkout's or
    environment's: from its site-packages/, or from its services/ or recmesh/ package)."""
    name, _, where = raw.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    root = next((r for r in roots if path.startswith(r + "/")), None)
    if root is not None:
        path = path[len(root) + 1 :]
    elif "site-packages/" in path:
        path = path.rsplit("site-packages/", 1)[1]
    else:
        at = max(path.rfind("/services/"), path.rfind("/recmesh/"))
        path = path[at + 1 :] if at >= 0 else path
    return f"{name} ({path})" if path else name


def top_frames(folded: Path, n: int = 12) -> Frames:
    """The `n` frames with the most own samples and the most total samples."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in folded.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # py-spy's raw lines start with the process and thread, then the
        # frames from the outermost; those two are not functions.
        frames = [_frame(f) for f in stack.split(";") if " (" in f]
        if not frames:
            continue
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            if frame.split(" (", 1)[-1].startswith(PROJECT):
                total[frame] += count
    if samples == 0:
        return Frames(0, [], [])

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(frame, c / samples) for frame, c in counter.most_common(n)]

    return Frames(samples, shares(own), shares(total))


def report(out_dir: Path, n: int = 12) -> str:
    """Every process's top frames, as text."""
    lines = [f"profiles (py-spy, running threads only): {out_dir}/*.folded"]
    for folded in sorted(out_dir.glob("*.folded")):
        frames = top_frames(folded, n)
        lines.append(f"\n{folded.stem}: {frames.samples} samples; own time")
        lines += [f"  {share:6.1%}  {frame}" for frame, share in frames.own]
        lines.append(f"{folded.stem}: total time (our frame anywhere on the stack)")
        lines += [f"  {share:6.1%}  {frame}" for frame, share in frames.total]
    return "\n".join(lines)
