"""The GEMM peak under the progress line's MFU is measured once per machine and kept with its
date, so the same step shows the same MFU in every process; a stale, damaged or foreign entry is
measured again."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import torch

from normlab.train import perf


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path))
    perf.quick_peak_tflops.cache_clear()
    measured = []

    def measure(dtype, device, *, sizes, seconds):
        measured.append((dtype, device))
        return 1.5

    monkeypatch.setattr(perf, "gemm_peak_tflops", measure)
    yield tmp_path / perf.PEAK_FILE, measured
    perf.quick_peak_tflops.cache_clear()


def test_measured_once_per_machine_and_kept_with_its_date(cache):
    path, measured = cache
    assert perf.quick_peak_tflops(torch.float32, "cpu") == 1.5
    perf.quick_peak_tflops.cache_clear()  # as a new process
    assert perf.quick_peak_tflops(torch.float32, "cpu") == 1.5
    assert len(measured) == 1
    entry = json.loads(path.read_text())[perf.peak_key(torch.float32, "cpu")]
    age = datetime.now(timezone.utc) - datetime.fromisoformat(entry["measured"])
    assert entry["tflops"] == 1.5 and timedelta(0) <= age < timedelta(minutes=1)
    assert "float32" in perf.peak_key(torch.float32, "cpu")
    assert perf.peak_key(torch.bfloat16, "cpu") != perf.peak_key(torch.float32, "cpu")


@pytest.mark.parametrize("entry", [
    {"tflops": 9.0, "measured": "2000-01-01T00:00:00+00:00"},  # too old
    {"tflops": 9.0, "measured": "in the morning"},
    {"tflops": -1.0, "measured": None},
    "9.0",
])
def test_a_stale_or_damaged_entry_is_measured_again(cache, entry):
    path, measured = cache
    path.write_text(json.dumps({perf.peak_key(torch.float32, "cpu"): entry, "other": 1}))
    assert perf.quick_peak_tflops(torch.float32, "cpu") == 1.5
    assert len(measured) == 1
    assert json.loads(path.read_text())["other"] == 1  # other machines' entries kept


def test_a_damaged_file_is_measured_again_and_replaced(cache):
    path, measured = cache
    path.write_text("{not json")
    assert perf.quick_peak_tflops(torch.float32, "cpu") == 1.5
    assert json.loads(path.read_text())[perf.peak_key(torch.float32, "cpu")]["tflops"] == 1.5
