"""Load signals of the inference service and the degradation level it suggests.

GPU memory comes from NVML (the `nvidia-ml-py` package, in the `gpu` extra)
when a GPU is present; queue depth from the micro-batcher. Every Score answer
carries the suggestion as trailing metadata `x-recmesh-suggested-level`, so the
ranker can step down before the GPU falls over (design notes: graded
degradation when GPU memory passes 92%).
"""

from __future__ import annotations

import structlog
from prometheus_client import Gauge

from recmesh.resilience import load_band

_log = structlog.get_logger("recmesh.inference.pressure")

GPU_MEMORY_THRESHOLD = 0.92

GPU_MEMORY = Gauge("recmesh_inference_gpu_memory_used_ratio", "GPU memory in use / total (NVML).", ("gpu",))
SUGGESTED = Gauge("recmesh_inference_suggested_level", "Degradation level suggested to callers.")


def suggest_level(
    gpu_memory_ratio: float | None, queue_depth: int, queue_capacity: int, queue_threshold: int
) -> int:
    """0 while GPU memory is under 92% and the queue under its threshold; past
    either, a level by how loaded the worse of the two is (the design notes'
    load bands): >= 0.95 -> 3, >= 0.85 -> 2, else 1."""
    memory = gpu_memory_ratio or 0.0
    if memory < GPU_MEMORY_THRESHOLD and queue_depth < queue_threshold:
        return 0
    return max(1, load_band(max(memory, queue_depth / max(1, queue_capacity))))


class GpuProbe:
    """NVML memory readings; `None` readings where no GPU or NVML is available."""

    def __init__(self) -> None:
        self._handles: list[object] = []
        try:
            import pynvml  # type: ignore[import-not-found, unused-ignore]

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            _log.info("nvml_ready", gpus=len(self._handles))
        except Exception as err:  # no package, no driver, no GPU: all mean "no reading"
            _log.info("nvml_unavailable", reason=repr(err))

    def memory_ratio(self) -> float | None:
        if not self._handles:
            return None
        worst = 0.0
        for i, handle in enumerate(self._handles):
            info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            ratio = float(info.used) / float(info.total)
            GPU_MEMORY.labels(str(i)).set(ratio)
            worst = max(worst, ratio)
        return worst
