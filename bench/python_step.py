"""The cost of stepping from Python: `Sampler.step` called from Python against the same Rust
step timed inside Rust (`Sampler._time_rust_steps`, the same build, pipeline, row and state),
at a Llama-3-sized vocabulary (V = 128,256), plus a recorded step (`logprobs=5`) and
`step_batch` per row.

    pip install ./crates/python        # release build
    python bench/python_step.py [--iterations 2000] [--vocab 128256]

Each figure is the median of `--repeats` runs of `--iterations` steps; the state keeps
growing its history as in a real generation.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

import nextok


def row(v: int, seed: int) -> np.ndarray:
    """A logits row with an LLM-like shape: mostly small, a few large."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 2.0, size=v).astype(np.float32)
    x[rng.integers(0, v, size=32)] += rng.uniform(8.0, 14.0, size=32).astype(np.float32)
    return x


def median_us(f, iterations: int, repeats: int) -> float:
    """Median over `repeats` of the mean microseconds per iteration of `f(iterations)`."""
    runs = []
    for _ in range(repeats):
        runs.append(f(iterations) / iterations * 1e6)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=128_256)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    v = a.vocab
    x = row(v, 0)
    print(f"nextok {nextok.__version__}, Python {platform.python_version()}, V = {v:,}, "
          f"{a.iterations} steps x {a.repeats} runs (median)")
    configs = {
        "greedy (temperature 0)": nextok.Pipeline("reference", temperature=0.0),
        "T 0.8, top-p 0.95": nextok.Pipeline("reference", temperature=0.8, top_p=0.95),
        "vLLM: T 0.7, top-k 50, top-p 0.9, presence 0.5": nextok.Pipeline(
            "vllm", temperature=0.7, top_k=50, top_p=0.9, presence_penalty=0.5
        ),
    }
    print(f"{'pipeline':<48} {'Rust step':>10} {'Python step':>12} {'overhead':>9} {'recorded':>9} "
          f"{'batch/row':>10}")
    for name, pipeline in configs.items():
        s = nextok.Sampler(pipeline, v)

        def rust(n: int) -> float:
            return s._time_rust_steps(x, s.new_state(seed=1), n)

        def python(n: int, logprobs: int | None = None) -> float:
            st = s.new_state(seed=1)
            step = s.step
            t0 = time.perf_counter()
            if logprobs is None:
                for _ in range(n):
                    step(x, st)
            else:
                for _ in range(n):
                    step(x, st, logprobs=logprobs)
            return time.perf_counter() - t0

        rows = np.stack([row(v, i) for i in range(a.batch)])

        def batch(n: int) -> float:
            states = [s.new_state(seed=i) for i in range(a.batch)]
            steps = max(1, n // a.batch)
            t0 = time.perf_counter()
            for _ in range(steps):
                s.step_batch(rows, states)
            return (time.perf_counter() - t0) * n / (steps * a.batch)

        python(50)  # warm up (workspace, caches)
        r = median_us(rust, a.iterations, a.repeats)
        p = median_us(python, a.iterations, a.repeats)
        rec = median_us(lambda n: python(n, 5), max(1, a.iterations // 4), a.repeats)
        b = median_us(batch, a.iterations, a.repeats)
        print(f"{name:<48} {r:>8.1f}us {p:>10.1f}us {p - r:>7.1f}us {rec:>7.1f}us {b:>8.1f}us")


if __name__ == "__main__":
    main()
