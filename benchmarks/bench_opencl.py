"""``computehal bench --backend opencl`` with a forced OpenCL kernel profile.

Usage: ``python benchmarks/bench_opencl.py [--device N] [--profile gpu|cpu] [bench options]``.
The OpenCL backend picks its kernel profile (work-group shapes) from the device type;
``--profile`` forces one, to compare both on the same device. Every other option is
``computehal bench``'s (``--quick``, ``--groups``, ``--out``, ...); see
:mod:`computehal.bench` for what is measured.
"""

from __future__ import annotations

import argparse
import sys

from computehal.backends.opencl import OpenCLBackend
from computehal.bench import main as bench_main


def main(argv: list[str] | None = None) -> int:
    """Start the OpenCL backend with the asked-for profile and run the harness on it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0, help="OpenCL device ordinal")
    parser.add_argument("--profile", choices=("gpu", "cpu"), default=None, help="force a kernel profile")
    args, rest = parser.parse_known_args(argv)
    with OpenCLBackend(args.device, kernel_profile=args.profile) as backend:
        print(f"OpenCL kernel profile: {backend.kernel_profile}")
        return bench_main(["--backend", f"opencl:{args.device}", *rest], backend=backend)


if __name__ == "__main__":
    sys.exit(main())
