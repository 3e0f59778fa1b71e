"""The Helm chart from tests: find ``helm``, render the chart, and send its objects to an apiserver.

``helm`` is built from the Go module proxy at a pinned version by ``hack/helm/build.sh`` (the last
line it prints is the binary); ``$GPUSLICE_HELM`` names a prebuilt one. ``resource_path`` maps a
rendered object to its REST path for the kinds the chart renders (plus the CRD-backed ones the
optional values add), so tests can POST them, for real or as a server-side dry run.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuslice_dev import controlplane
from gpuslice_dev.paths import REPO_ROOT

CHART_DIR = REPO_ROOT / "charts" / "gpuslice"
BUILD_SCRIPT = REPO_ROOT / "hack" / "helm" / "build.sh"

# kind -> (API prefix, plural, namespaced)
_KINDS: dict[str, tuple[str, str, bool]] = {
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Pod": ("/api/v1", "pods", True),
    "ResourceQuota": ("/api/v1", "resourcequotas", True),
    "Secret": ("/api/v1", "secrets", True),
    "Service": ("/api/v1", "services", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        False,
    ),
    "ServiceMonitor": ("/apis/monitoring.coreos.com/v1", "servicemonitors", True),
    "Certificate": ("/apis/cert-manager.io/v1", "certificates", True),
    "Issuer": ("/apis/cert-manager.io/v1", "issuers", True),
}


class ChartError(RuntimeError):
    """helm failed, or a rendered object is of a kind this module does not know."""


def helm_binary() -> Path:
    """``$GPUSLICE_HELM``, else the binary ``hack/helm/build.sh`` builds (or finds cached).

    Raises:
        ControlPlaneError: the build failed.
    """
    return controlplane.built_path(BUILD_SCRIPT, "GPUSLICE_HELM")


def set_args(values: Mapping[str, object]) -> list[str]:
    """``--set-json key=value`` arguments (JSON keeps types: ``3`` stays a number, ``"3"`` a string)."""
    out: list[str] = []
    for key, value in values.items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


def helm(*args: str, chart: Path = CHART_DIR) -> str:
    """Run ``helm <args> <chart>``; returns stdout.

    Raises:
        ChartError: helm exited non-zero (its stderr is in the message).
    """
    proc = subprocess.run(  # noqa: S603 - our helm binary and arguments
        [str(helm_binary()), *args], capture_output=True, text=True, check=False, cwd=chart.parent
    )
    if proc.returncode != 0:
        raise ChartError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return proc.stdout


def template(
    values: Mapping[str, object] | None = None,
    *,
    release: str = "gpuslice",
    namespace: str = "gpuslice-system",
    chart: Path = CHART_DIR,
    tests: bool = False,
    kube_version: str | None = None,
    kubeconfig: Path | None = None,
) -> list[dict[str, Any]]:
    """``helm template`` with ``values``; the rendered objects in order.

    Args:
        values: ``--set-json`` values.
        release: the release name.
        namespace: the release namespace.
        chart: the chart directory.
        tests: also render the ``helm test`` hooks (``helm install`` does not create them).
        kube_version: the cluster version the chart sees (``--kube-version``; helm's default else).
        kubeconfig: render against this cluster (``--validate --dry-run=server``): its version, and
            ``lookup`` reads its objects, as ``helm install`` / ``helm upgrade`` do.
    """
    args = _render_args(release, chart, namespace, values, tests, kube_version, kubeconfig)
    text = helm("template", *args, chart=chart)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def template_text(
    values: Mapping[str, object] | None = None,
    *,
    release: str = "gpuslice",
    namespace: str = "gpuslice-system",
    chart: Path = CHART_DIR,
    tests: bool = False,
    kube_version: str | None = None,
) -> str:
    """``helm template`` output as text (``template`` parses it; duplicate-key checks need the text)."""
    args = _render_args(release, chart, namespace, values, tests, kube_version, None)
    return helm("template", *args, chart=chart)


def _render_args(
    release: str,
    chart: Path,
    namespace: str,
    values: Mapping[str, object] | None,
    tests: bool,
    kube_version: str | None,
    kubeconfig: Path | None,
) -> list[str]:
    args = [release, str(chart), "--namespace", namespace, *set_args(values or {})]
    if not tests:
        args.append("--skip-tests")
    if kube_version is not None:
        args += ["--kube-version", kube_version]
    if kubeconfig is not None:
        # --validate: capabilities (the version) from the cluster; --dry-run=server: lookup reads it
        args += ["--validate", "--dry-run=server", "--kubeconfig", str(kubeconfig)]
    return args


def lint(values: Mapping[str, object] | None = None, *, chart: Path = CHART_DIR) -> str:
    """``helm lint --strict`` output (raises ChartError when it fails)."""
    return helm("lint", "--strict", str(chart), *set_args(values or {}), chart=chart)


def resource_path(obj: Mapping[str, Any], namespace: str | None = None) -> str:
    """The collection path to POST ``obj`` to (``namespace`` overrides its own).

    Raises:
        ChartError: a kind the chart is not known to render.
    """
    kind = str(obj.get("kind"))
    if kind not in _KINDS:
        raise ChartError(f"no REST path known for kind {kind!r}")
    prefix, plural, namespaced = _KINDS[kind]
    if not namespaced:
        return f"{prefix}/{plural}"
    ns = namespace or obj.get("metadata", {}).get("namespace") or "default"
    return f"{prefix}/namespaces/{ns}/{plural}"


def find(objects: Sequence[Mapping[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The one rendered object of ``kind`` whose name ends with ``name_suffix``.

    Raises:
        ChartError: none or several match.
    """
    hits = [
        dict(o) for o in objects if o.get("kind") == kind and str(o["metadata"]["name"]).endswith(name_suffix)
    ]
    if len(hits) != 1:
        names = [o["metadata"]["name"] for o in objects if o.get("kind") == kind]
        raise ChartError(f"expected one {kind} named *{name_suffix}, found {len(hits)} among {names}")
    return hits[0]


def pod_spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The pod spec of a rendered Pod, or of a Deployment's or DaemonSet's pod template."""
    spec = obj["spec"] if obj.get("kind") == "Pod" else obj["spec"]["template"]["spec"]
    return dict(spec)
