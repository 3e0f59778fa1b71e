"""Mixed GPU pods for the chaos tier, created from several threads (seeded, reproducible).

Four shapes, HAMi's resource names: a fraction (``nvidia.com/gpu: 1`` + ``gpumem`` MiB +
``gpucores``), a whole card (``nvidia.com/gpu: 1`` alone: exclusive), several cards (2-4, each with
``gpumem``) and a percentage (``gpumem-percentage``). Sized so the cluster fills up: contention
for the last cards is the point, so some pods must stay pending.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuslice_dev.controlplane import ControlPlane

SHAPES = ("fraction", "whole", "multi", "percentage")
DEFAULT_WEIGHTS: Mapping[str, float] = {"fraction": 0.45, "whole": 0.15, "multi": 0.15, "percentage": 0.25}


@dataclasses.dataclass(frozen=True)
class PodShape:
    """One pod's GPU limits and its shape name."""

    kind: str
    limits: dict[str, str]


def draw(rng: random.Random, weights: Mapping[str, float] = DEFAULT_WEIGHTS) -> PodShape:
    """One random shape."""
    kind = rng.choices(list(weights), weights=list(weights.values()))[0]
    if kind == "fraction":
        limits = {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem": str(rng.randrange(4000, 40001, 1000)),
            "nvidia.com/gpucores": str(rng.randrange(10, 61, 5)),
        }
    elif kind == "whole":
        limits = {"nvidia.com/gpu": "1"}
    elif kind == "multi":
        limits = {
            "nvidia.com/gpu": str(rng.randint(2, 4)),
            "nvidia.com/gpumem": str(rng.randrange(8000, 30001, 1000)),
        }
    elif kind == "percentage":
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": str(rng.randrange(10, 51, 5))}
    else:
        raise ValueError(f"unknown shape {kind!r}")
    return PodShape(kind, limits)


def pod_body(
    namespace: str,
    name: str,
    limits: Mapping[str, str],
    scheduler: str,
    *,
    node_names: Sequence[str] = (),
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A one-container pod; ``node_names`` pins it to those nodes (required node affinity)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"app": "chaos"}}
    if annotations:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": "pause", "resources": {"limits": dict(limits)}}],
    }
    if node_names:
        term = {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": list(node_names)}
            ]
        }
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def mixed_pods(
    n: int,
    seed: int,
    namespace: str,
    scheduler: str,
    *,
    prefix: str = "p",
    weights: Mapping[str, float] = DEFAULT_WEIGHTS,
    node_names: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """``n`` pod bodies of random shapes (``random.Random(seed)``), named ``<prefix>-<i>-<shape>``."""
    rng = random.Random(seed)
    bodies = []
    for i in range(n):
        shape = draw(rng, weights)
        name = f"{prefix}-{i:03d}-{shape.kind}"
        bodies.append(pod_body(namespace, name, shape.limits, scheduler, node_names=node_names))
    return bodies


def demand_cards(bodies: Sequence[Mapping[str, Any]], card_memory_mib: int) -> float:
    """Rough demand in cards: per card the larger of its memory and core shares (exclusive: 1)."""
    total = 0.0
    for body in bodies:
        limits = body["spec"]["containers"][0]["resources"]["limits"]
        count = int(limits["nvidia.com/gpu"])
        if "nvidia.com/gpumem" in limits:
            share = min(1.0, int(limits["nvidia.com/gpumem"]) / card_memory_mib)
        elif "nvidia.com/gpumem-percentage" in limits:
            share = int(limits["nvidia.com/gpumem-percentage"]) / 100
        else:
            share = 1.0
        if "nvidia.com/gpucores" in limits:
            share = max(share, int(limits["nvidia.com/gpucores"]) / 100)
        total += count * share
    return total


def create(cp: ControlPlane, body: Mapping[str, Any], attempts: int = 5) -> str:
    """Create one pod (retrying while the apiserver does not answer); returns its name."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    last: Any = None
    for attempt in range(attempts):
        status, obj = cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", body, timeout=15)
        if status == 201:
            return str(name)
        if status == 409:  # an earlier attempt got through but its answer was lost
            return str(name)
        last = (status, obj)
        time.sleep(0.5 * (attempt + 1))
    raise AssertionError(f"create pod {ns}/{name}: {last}")


def create_all(
    cp: ControlPlane,
    bodies: Sequence[Mapping[str, Any]],
    threads: int = 4,
    pace_s: float = 0.0,
    on_created: Callable[[str], None] | None = None,
) -> list[str]:
    """Create the pods from ``threads`` threads; ``pace_s`` pauses each thread between pods."""
    lock = threading.Lock()

    def one(body: Mapping[str, Any]) -> str:
        name = create(cp, body)
        if on_created is not None:
            with lock:
                on_created(name)
        if pace_s:
            time.sleep(pace_s)
        return name

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="chaos-load") as pool:
        return list(pool.map(one, bodies))


class Background:
    """``create_all`` in a background thread; ``join()`` returns the names or re-raises."""

    def __init__(
        self, cp: ControlPlane, bodies: Sequence[Mapping[str, Any]], threads: int = 4, pace_s: float = 0.0
    ) -> None:
        self.created: list[str] = []
        self._names: list[str] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(cp, list(bodies), threads, pace_s), name="chaos-load", daemon=True
        )

    def _run(self, cp: ControlPlane, bodies: list[Mapping[str, Any]], threads: int, pace_s: float) -> None:
        try:
            self._names = create_all(cp, bodies, threads, pace_s, on_created=self.created.append)
        except BaseException as err:  # noqa: BLE001 - re-raised by join()
            self._error = err

    def start(self) -> Background:
        """Start creating."""
        self._thread.start()
        return self

    def join(self, timeout: float = 300.0) -> list[str]:
        """Wait for every pod to be created."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"pod creation still running after {timeout:.0f} s")
        if self._error is not None:
            raise self._error
        return self._names
