"""scripts/bench/bulk_cpu.py: the pure part that turns each round's deltas
into the figures (CPU per GiB, min of the rounds; switches, median)."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench")


@pytest.fixture(scope="module")
def bulk_cpu():
    spec = importlib.util.spec_from_file_location("bench_bulk_cpu", os.path.join(BENCH, "bulk_cpu.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_bulk_cpu"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_bulk_cpu", None)


def test_cpu_is_the_min_of_the_rounds_per_gib_and_summed_over_the_processes(bulk_cpu):
    rows = [{"gbps": 1.0, "client": (0.4, 0, 0, 0), "relay": (0.5, 300, 100, 0.1), "sink": (0.6, 200, 50, 0.2)},
            {"gbps": 2.0, "client": (0.3, 0, 0, 0), "relay": (0.7, 500, 300, 0.3), "sink": (0.5, 400, 150, 0.1)},
            {"gbps": 0.5, "client": (0.5, 0, 0, 0), "relay": (0.6, 400, 200, 0.2), "sink": (0.9, 600, 250, 0.4)}]
    out = bulk_cpu.figures(rows, 0.5)
    assert out["gbps"] == 1.0 and out["best_gbps"] == 2.0
    assert out["client"]["cpu"] == pytest.approx(0.6)        # 0.3 s for half a GiB
    assert out["relay"]["cpu"] == pytest.approx(1.0)
    assert out["sink"]["cpu"] == pytest.approx(1.0)
    assert out["cpu_sum"] == pytest.approx(2.6)
    assert out["relay"]["voluntary"] == pytest.approx(800) and out["sink"]["involuntary"] == pytest.approx(300)
    assert out["relay"]["waited_ms"] == pytest.approx(400) and out["sink"]["waited_ms"] == pytest.approx(400)


def test_direct_has_no_relay_row(bulk_cpu):
    rows = [{"gbps": 1.0, "client": (0.2, 0, 0, 0), "sink": (0.3, 10, 20, 0.05)}]
    out = bulk_cpu.figures(rows, 1.0)
    assert "relay" not in out and out["cpu_sum"] == pytest.approx(0.5)
