"""How long an informer relist of N pods takes: end to end on a real apiserver, and decode alone.

    .venv/bin/python bench/bench_relist.py --pods 10000

Creates N GPU pods (HAMi annotations, two containers with resources) in one namespace of a fresh
local control plane, then times ``Informer.relist()`` (paged list at the informer's page size,
decode, store, events) several times, and separately times decoding the same list pages without
I/O. ``bench/bench_scale.py`` does the same at 150 000 pods through the extender's whole feed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from gpuslice.kube import client as kclient
from gpuslice.kube import informer, kinds
from gpuslice_dev.controlplane import ControlPlane

NS = "bench"
ANNOTATIONS = {
    "hami.io/vgpu-node": "gpu-node-017",
    "hami.io/vgpu-time": "1764460000",
    "hami.io/vgpu-devices-allocated": "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,30:;;",
    "hami.io/vgpu-devices-to-allocate": ";;",
    "hami.io/bind-phase": "success",
    "hami.io/bind-time": "1764460001",
}


def pod(i: int) -> dict[str, Any]:
    res = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p-{i:05d}",
            "labels": {"app": f"job-{i % 50}", "hami.io/vgpu-node": "gpu-node-017"},
            "annotations": ANNOTATIONS,
        },
        "spec": {
            "schedulerName": "none",
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": res},
                {
                    "name": "side",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m"}},
                },
            ],
        },
    }


async def create_pods(kube: kclient.KubeClient, n: int, concurrency: int = 32) -> float:
    start = time.perf_counter()
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=pod(i))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def main(n: int, rounds: int) -> None:
    with ControlPlane() as cp:
        async with kclient.KubeClient.from_kubeconfig(cp.kubeconfig, qps=0) as kube:
            await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
            took = await create_pods(kube, n)
            print(f"created {n} pods in {took:.1f} s ({n / took:.0f}/s)")
            kind = kinds.PODS.in_namespace(NS)
            times = []
            for _ in range(rounds):
                inf = informer.Informer(kube, kind, lambda e: None)
                t0 = time.perf_counter()
                await inf.relist()
                times.append(time.perf_counter() - t0)
                assert len(inf.store) == n
            print(
                f"relist {n} pods (page {informer.DEFAULT_PAGE_SIZE}), end to end: "
                f"median {statistics.median(times):.3f} s, "
                f"min {min(times):.3f} s over {rounds} rounds"
            )
            pages = []
            cont = ""
            while True:
                params: dict[str, str | int | bool] = {"limit": informer.DEFAULT_PAGE_SIZE}
                if cont:
                    params["continue"] = cont
                resp = await kube.request("GET", kind.path, params=params)
                pages.append(resp.content)
                cont = kind.list_decoder.decode(resp.content).metadata.continue_
                if not cont:
                    break
            size = sum(len(p) for p in pages)
            dec = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for p in pages:
                    kind.list_decoder.decode(p)
                dec.append(time.perf_counter() - t0)
            print(
                f"decode only: {len(pages)} pages, {size / 1e6:.1f} MB: "
                f"median {statistics.median(dec):.3f} s ({statistics.median(dec) / n * 1e6:.1f} us/pod)"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.pods, args.rounds))
