"""Write gpuspecXX variants of an openb pod list: XX % of its GPU pods pinned to GPU models.

The public Alibaba trace (alibaba/clusterdata ``cluster-trace-gpu-v2023``) ships ``gpuspec10``:
the default pod list with a ``gpu_spec`` on about 10 % of the GPU pods. Heavier variants (the FGD
artifact's gpuspec20/25/33) are not all public, so this draws them the same way: each GPU pod of
the default list gets, with probability XX %, a ``gpu_spec`` drawn from the mix of specs that
``gpuspec10`` carries (seeded; the other columns are the default list's). Used to check that a
policy holds on model-constrained workloads it was not tuned on.

Run: .venv/bin/python bench/make_gpuspec.py --pods DEFAULT.csv --specs GPUSPEC10.csv --out DIR
     [--pct 20,25,33,50]
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import random


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", required=True, type=pathlib.Path, help="openb_pod_list_default.csv")
    parser.add_argument("--specs", required=True, type=pathlib.Path, help="openb_pod_list_gpuspec10.csv")
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--pct", default="20,25,33,50")
    args = parser.parse_args()
    with args.specs.open(newline="") as fh:
        specs = [r["gpu_spec"] for r in csv.DictReader(fh) if r["gpu_spec"]]
    with args.pods.open(newline="") as fh:
        reader = csv.DictReader(fh)
        fields = list(reader.fieldnames or ())
        rows = list(reader)
    args.out.mkdir(parents=True, exist_ok=True)
    for k, pct in enumerate(int(p) for p in args.pct.split(",")):
        rng = random.Random(k + 1)
        out = []
        for r in rows:
            r = dict(r)
            if int(r["num_gpu"]) > 0 and rng.random() < pct / 100:
                r["gpu_spec"] = rng.choice(specs)
            out.append(r)
        path = args.out / f"openb_pod_list_gpuspec{pct}.csv"
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            w.writerows(out)
        print(path)


if __name__ == "__main__":
    main()
