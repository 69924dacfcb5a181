"""Shared helpers of the nextok Python tests."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "testdata" / "vectors"


def in_ci() -> bool:
    """Whether CI is set (as the Rust tests read it: anything but empty, 0 or false)."""
    v = os.environ.get("CI", "")
    return v not in ("", "0", "false")


def require_data(rel: str) -> Path:
    """A file of the fetched test data; skips the test when it is absent, fails under CI."""
    base = Path(os.environ.get("NEXTOK_TESTDATA", REPO / ".testdata"))
    p = base / rel
    if not p.is_file():
        if in_ci():
            pytest.fail(f"test data {p} is missing (CI is set): run scripts/fetch-testdata.sh")
        pytest.skip(f"test data {p} is absent; run scripts/fetch-testdata.sh")
    return p


def logit(x: object) -> float:
    """One logit of the request format: a number or "-inf" / "inf" / "nan"."""
    if isinstance(x, str):
        return {"-inf": -np.inf, "inf": np.inf, "+inf": np.inf, "nan": np.nan, "NaN": np.nan}[x]
    return float(x)  # type: ignore[arg-type]


def row(values: list[object]) -> np.ndarray:
    """A request's logits as the float32 row the sampler reads."""
    return np.array([logit(x) for x in values], dtype=np.float32)


def load_cases() -> list[tuple[str, dict]]:
    """Every case of every shared vector file, as (file / name, case)."""
    files = sorted(VECTORS.glob("*.json"))
    out = []
    for f in files:
        for case in json.loads(f.read_text())["cases"]:
            out.append((f"{f.name} / {case['name']}", case))
    return out


def share_while(call: Callable[[], object]) -> float:
    """How much a pure-Python counting thread ran while ``call`` ran, as a share of what it
    runs alone in the same time. Near 0 when ``call`` holds the GIL (the counter then only runs
    at the interpreter's switch points, a few milliseconds at most); a large share when it is
    released."""
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=count)
    t.start()
    try:
        time.sleep(0.05)
        t0, a = time.perf_counter(), ticks
        time.sleep(0.3)  # the counter alone (sleep releases the GIL)
        rate = (ticks - a) / (time.perf_counter() - t0)
        t0, before = time.perf_counter(), ticks
        call()
        during, elapsed = ticks - before, time.perf_counter() - t0
    finally:
        stop.set()
        t.join()
    return during / (rate * elapsed)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "torch: runs transformers and torch for real (skipped where not installed)")
    config.addinivalue_line(
        "markers", "llama_cpp: runs llama-cpp-python for real (skipped where not installed; see bench/llama_cpp_adapter.sh)"
    )
    config.addinivalue_line("markers", "vllm: builds the vLLM classes on vLLM's own types (skipped where not installed)")
