"""MIG placement at saturation: HAMi's first fit against the fragmentation rule (docs/mig-simulation.md).

Runs ``gpuslice simulate --mig`` over both request mixes and ten seeds and prints the markdown table
with the exact command. Usage: ``.venv/bin/python bench/bench_mig.py [extra simulate flags]``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

ARGS = ["--mig", "alibaba,synthetic", "--seeds", "42-51", "--mig-nodes", "8", "--mig-load", "1.4"]


def main() -> int:
    """Run the simulation and print the command, the table and the wall time."""
    args = ARGS + sys.argv[1:]
    if not any(a.startswith("--jobs") for a in args):
        args += ["--jobs", str(os.cpu_count() or 1)]
    cmd = [sys.executable, "-m", "gpuslice", "simulate", *args]
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - start
    print(f"`gpuslice simulate {shlex.join(args)}` ({wall:.0f} s on {os.cpu_count()} CPUs)\n")
    print(out.rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
