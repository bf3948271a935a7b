from __future__ import annotations

import importlib.util

from services.inference.pressure import GpuProbe, suggest_level


def test_no_pressure_no_degradation() -> None:
    assert suggest_level(None, 0, 256, 128) == 0
    assert suggest_level(0.91, 127, 256, 128) == 0


def test_gpu_memory_past_92_percent_steps_down_by_load_band() -> None:
    assert suggest_level(0.92, 0, 256, 128) == 2  # 0.92 is in the >= 0.85 band
    assert suggest_level(0.96, 0, 256, 128) == 3


def test_queue_past_its_threshold_steps_down() -> None:
    assert suggest_level(None, 128, 256, 128) == 1  # half full
    assert suggest_level(None, 220, 256, 128) == 2
    assert suggest_level(None, 250, 256, 128) == 3


def test_probe_reads_nvml_or_nothing() -> None:
    reading = GpuProbe().memory_ratio()
    if importlib.util.find_spec("pynvml") is None:
        assert reading is None  # CPU machines: no NVML, no reading, no error
    else:
        assert reading is None or 0.0 <= reading <= 1.0
