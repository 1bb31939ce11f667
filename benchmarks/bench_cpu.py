"""Benchmark every CpuBackend op against this machine's measured limits.

Usage: ``python benchmarks/bench_cpu.py [--quick] [--json PATH] [--plot PATH]`` (the same
as ``computehal bench``); see :mod:`computehal.bench` for what is measured and how.
"""

from __future__ import annotations

import sys

from computehal.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
