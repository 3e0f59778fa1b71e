"""Pod helpers over a control plane's API, shared by the tiers that run real nodes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from gpuslice_dev.controlplane import ControlPlane


class PodOps:
    """Create, read, wait for and delete pods (and namespaces) through the apiserver."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    # ------------------------------------------------------------------ objects
    def namespace(self, prefix: str = "node") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        status, body = self.cp.api_request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        assert status == 201, body
        return name

    def create(self, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
        pod.setdefault("apiVersion", "v1")
        pod.setdefault("kind", "Pod")
        pod["metadata"]["namespace"] = ns
        status, obj = self.cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
        assert status == 201, obj
        return obj

    def pod(self, ns: str, name: str) -> dict[str, Any] | None:
        status, obj = self.cp.api_request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        if status == 404:
            return None
        assert status == 200, obj
        return obj

    def delete(self, ns: str, name: str, grace: int | None = 0) -> None:
        query = "" if grace is None else f"?gracePeriodSeconds={grace}"
        self.cp.api_request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}{query}")

    def log(self, ns: str, name: str, container: str) -> str:
        status, body = self.cp.api_request(
            "GET", f"/api/v1/namespaces/{ns}/pods/{name}/log?container={container}", timeout=15
        )
        assert status == 200, body
        text = body.get("text", "") if isinstance(body, dict) else str(body)
        return str(text)

    def env(self, ns: str, name: str, container: str) -> dict[str, str]:
        """The container's environment as it printed it (``env`` before anything else)."""
        out: dict[str, str] = {}
        for line in self.log(ns, name, container).splitlines():
            if line == "--env-end--":
                break
            key, sep, value = line.partition("=")
            if sep:
                out[key] = value
        return out

    # ------------------------------------------------------------------ waiting
    def wait(self, what: Callable[[], Any], timeout: float = 60.0, message: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = what()
            if got:
                return got
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout:.0f} s: {message}\n{self.diagnostics()}")

    def phase(self, ns: str, name: str) -> str:
        pod = self.pod(ns, name)
        return "" if pod is None else str(pod.get("status", {}).get("phase", ""))

    def wait_running(self, ns: str, name: str, timeout: float = 90.0) -> dict[str, Any]:
        """The pod once every app container runs (a failed admission fails the wait at once)."""

        def running() -> dict[str, Any] | None:
            pod = self.pod(ns, name)
            if pod is None:
                return None
            status = pod.get("status", {})
            if status.get("phase") == "Failed":
                raise AssertionError(f"pod {ns}/{name} failed: {status}\n{self.diagnostics()}")
            states = status.get("containerStatuses") or []
            if status.get("phase") == "Running" and states and all("running" in s["state"] for s in states):
                return pod
            return None

        result: dict[str, Any] = self.wait(running, timeout, f"pod {ns}/{name} not Running")
        return result

    def wait_gone(self, ns: str, name: str, timeout: float = 60.0) -> None:
        self.wait(lambda: self.pod(ns, name) is None, timeout, f"pod {ns}/{name} still exists")

    def diagnostics(self) -> str:
        """What a failed wait shows besides its message (the subclass knows its processes)."""
        return ""
