"""The chart's values as an operator meets them: values.schema.json, values of HAMi's chart, and the
kube-scheduler image tag that follows the cluster.

Every failure asserted here is helm's own error text (``helm template`` / ``helm lint --strict`` with
the pinned helm), so what is checked is what an operator reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpuslice_dev import chart
from gpuslice_dev.controlplane import ControlPlane

pytestmark = pytest.mark.integration

SCHEMA = json.loads((chart.CHART_DIR / "values.schema.json").read_text())
VALUES = yaml.safe_load((chart.CHART_DIR / "values.yaml").read_text())

# Keys whose value is a Kubernetes object or a map the chart passes through as is: the schema leaves
# their inside open (the apiserver validates them; the dry-run tests in test_chart.py send them).
FREE_FORM = {
    "resources",
    "scheduler.resources",
    "webhook.resources",
    "agent.resources",
    "affinity",
    "nodeSelector",
    "agent.nodeSelector",
    "tolerations",
    "agent.tolerations",
    "podAnnotations",
    "podLabels",
    "extraEnv",
    "extraVolumes",
    "extraVolumeMounts",
    "agent.extraEnv",
    "agent.extraVolumes",
    "agent.extraVolumeMounts",
    "metrics.serviceMonitor.labels",
    "metrics.dashboard.labels",
    "webhook.namespaceSelector.matchLabels",
    "webhook.objectSelector.matchLabels",
}


def _schema_at(dotted: str) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


def _leaves(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict) and node and prefix.rstrip(".") not in FREE_FORM:
        for key, child in node.items():
            yield from _leaves(child, f"{prefix}{key}.")
    else:
        yield prefix.rstrip(".")


def _objects(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if node.get("type") == "object":
        yield path, node
    for key, child in node.get("properties", {}).items():
        yield from _objects(child, f"{path}.{key}".lstrip("."))
    items = node.get("items")
    if isinstance(items, dict):
        yield from _objects(items, f"{path}[]")
        for i, option in enumerate(items.get("anyOf", [])):
            yield from _objects(option, f"{path}[]{i}")


# ------------------------------------------------------------------------------------------ schema


def test_every_value_has_a_typed_schema() -> None:
    untyped = []
    for leaf in _leaves(VALUES):
        schema = _schema_at(leaf)
        if "type" not in schema and "anyOf" not in schema and "enum" not in schema:
            untyped.append(leaf)
    assert not untyped, f"values.yaml keys without a type in values.schema.json: {untyped}"


def test_every_object_refuses_unknown_keys_unless_free_form() -> None:
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    open_objects = [
        path
        for path, node in _objects(SCHEMA)
        if node.get("additionalProperties") is not False
        and path not in FREE_FORM
        and not path.startswith(
            ("extraEnv[]", "extraVolumes[]", "extraVolumeMounts[]", "tolerations[]")
            + ("agent.extraEnv[]", "agent.extraVolumes[]", "agent.extraVolumeMounts[]", "agent.tolerations[]")
        )
        and not path.endswith(("resources.requests", "resources.limits"))
    ]
    assert not open_objects, f"objects that accept any key: {open_objects}"


def test_every_schema_key_is_a_value_or_a_key_of_hamis_chart() -> None:
    """The schema declares nothing values.yaml lacks, except the HAMi keys it admits to name them."""
    extra = []
    for path, node in _objects(SCHEMA):
        if "[]" in path or path in FREE_FORM:
            continue
        in_values = VALUES
        for part in filter(None, path.split(".")):
            in_values = in_values[part]
        if in_values == {}:  # an empty default (a selector, an issuerRef) whose shape the schema gives
            continue
        for key, child in node.get("properties", {}).items():
            if key not in in_values and not child.get("description", "").startswith("A key of HAMi's chart"):
                extra.append(f"{path}.{key}".lstrip("."))
    assert not extra, extra


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"replica": 3}, "additional properties 'replica' not allowed"),
        ({"scheduler.imageTag": "v1.34.4"}, "at '/scheduler': additional properties 'imageTag' not allowed"),
        ({"webhook.namespaceSelector.matchExpression": []}, "'matchExpression' not allowed"),
        ({"replicas": "two"}, "at '/replicas': got string, want integer"),
        ({"tls.enabled": "yes"}, "at '/tls/enabled': got string, want boolean"),
        ({"tls.mode": "letsencrypt"}, "at '/tls/mode': value must be one of"),
        ({"podAntiAffinity": "always"}, "at '/podAntiAffinity': value must be one of"),
        ({"policy.nodeChoice": "random"}, "at '/policy/nodeChoice': value must be one of"),
        ({"webhook.failurePolicy": "Deny"}, "at '/webhook/failurePolicy': value must be one of"),
        ({"webhook.reinvocationPolicy": "Always"}, "at '/webhook/reinvocationPolicy': value must be one of"),
        ({"image.pullPolicy": "always"}, "at '/image/pullPolicy': value must be one of"),
        ({"leaderElect.leaseDuration": "15 seconds"}, "at '/leaderElect/leaseDuration'"),
        ({"webhook.timeoutSeconds": 45}, "at '/webhook/timeoutSeconds': maximum"),
        ({"agent.backend": "cuda"}, "at '/agent/backend'"),
        ({"extender.port": 70000}, "at '/extender/port': maximum"),
    ],
)
def test_the_schema_refuses_what_no_template_reads(values: dict[str, object], fragment: str) -> None:
    with pytest.raises(chart.ChartError) as err:
        chart.template(values)
    assert fragment in str(err.value), err.value
    assert "values don't meet the specifications of the schema" in str(err.value)


def test_accepted_spellings_still_render() -> None:
    """What the schema must not refuse: percentages, a duration of 0, HAMi's plain pull-secret names."""
    objects = chart.template(
        {
            "podDisruptionBudget.maxUnavailable": "50%",
            "cache.resyncPeriod": 0,
            "imagePullSecrets": ["regcred", {"name": "other"}],
            "agent.backend": "fake:t4-4",
        }
    )
    pod = chart.find(objects, "Deployment", "gpuslice")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
    assert chart.find(objects, "PodDisruptionBudget", "gpuslice")["spec"]["maxUnavailable"] == "50%"


# ---------------------------------------------------------------------------- HAMi's chart's values

# (HAMi key, a value as HAMi's values.yaml has it, the gpuslice key the error must name). The rows of
# the review's table "Values: HAMi key -> gpuslice key", one per HAMi key.
HAMI_KEYS: list[tuple[str, object, str]] = [
    ("schedulerName", "hami-scheduler", "`scheduler.name`"),
    ("scheduler.kubeScheduler.enabled", True, "`scheduler.enabled`"),
    ("scheduler.kubeScheduler.image.registry", "registry.k8s.io", "`scheduler.image.repository`"),
    ("scheduler.kubeScheduler.image.repository", "kube-scheduler", "`scheduler.image.repository`"),
    ("scheduler.kubeScheduler.image.tag", "", "`scheduler.image.tag`"),
    ("scheduler.kubeScheduler.image.pullPolicy", "IfNotPresent", "`scheduler.image.pullPolicy`"),
    ("scheduler.kubeScheduler.image.pullSecrets", [], "`imagePullSecrets`"),
    ("scheduler.kubeScheduler.image", {}, "`scheduler.image`"),
    ("scheduler.kubeScheduler.imageTag", "v1.31.1", "`scheduler.image.tag`"),
    ("scheduler.kubeScheduler.resources", {}, "`scheduler.resources`"),
    ("scheduler.kubeScheduler.extraNewArgs", ["-v=4"], "`scheduler.extraArgs`"),
    ("scheduler.kubeScheduler.extraArgs", ["-v=4"], "`scheduler.extraArgs`"),
    ("scheduler.extender.image.repository", "projecthami/hami", "`image.repository`"),
    ("scheduler.extender.image.tag", "v2.10.0", "`image.tag`"),
    ("scheduler.extender.resources", {}, "`resources`"),
    ("scheduler.extender.extraArgs", ["--debug"], "`extender.extraArgs`"),
    ("scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy", "binpack", "`policy.nodeSchedulerPolicy`"),
    ("scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy", "spread", "`policy.gpuSchedulerPolicy`"),
    ("scheduler.leaderElect", True, "`leaderElect.enabled`"),
    ("scheduler.replicas", 1, "`replicas`"),
    ("scheduler.nodeLockExpire", "5m", "`nodeLock.expiry`"),
    ("scheduler.metricsBindAddress", ":9395", "`extender.metricsPort`"),
    ("scheduler.forceOverwriteDefaultScheduler", True, "no gpuslice counterpart"),
    ("scheduler.livenessProbe", False, "no gpuslice counterpart"),
    ("scheduler.nodeSelector", {}, "`nodeSelector`"),
    ("scheduler.tolerations", [], "`tolerations`"),
    ("scheduler.nodeName", "", "`nodeSelector`"),
    ("scheduler.podAnnotations", {}, "`podAnnotations`"),
    ("scheduler.nodeLabelSelector", {"gpu": "on"}, "`nodeSelector`"),
    ("global.managedNodeSelectorEnable", False, "`nodeSelector`"),
    ("global.managedNodeSelector", {"usage": "gpu"}, "`nodeSelector`"),
    ("scheduler.admissionWebhook.enabled", True, "`webhook.enabled`"),
    ("scheduler.admissionWebhook.failurePolicy", "Fail", "`webhook.failurePolicy`"),
    ("scheduler.admissionWebhook.reinvocationPolicy", "Never", "`webhook.reinvocationPolicy`"),
    ("scheduler.admissionWebhook.manageNamespaceSelector", True, "no gpuslice counterpart"),
    ("scheduler.admissionWebhook.whitelistNamespaces", ["default"], "`webhook.namespaceSelector`"),
    ("scheduler.admissionWebhook.namespaceSelector", {"matchExpressions": []}, "`webhook.namespaceSelector`"),
    ("scheduler.admissionWebhook.objectSelector", {"matchExpressions": []}, "`webhook.objectSelector`"),
    ("scheduler.admissionWebhook.customURL", {"enabled": False}, "`webhook.url`"),
    ("scheduler.certManager", {"enabled": False}, "`tls.mode`"),
    ("scheduler.patch", {"enabled": True}, "`tls.mode`"),
    ("scheduler.service", {"type": "NodePort"}, "no gpuslice counterpart"),
    ("resourceName", "nvidia.com/gpu", "`resourceNames.count`"),
    ("resourceMem", "nvidia.com/gpumem", "`resourceNames.memory`"),
    ("resourceMemPercentage", "nvidia.com/gpumem-percentage", "`resourceNames.memoryPercentage`"),
    ("resourceCores", "nvidia.com/gpucores", "`resourceNames.cores`"),
    ("resourcePriority", "nvidia.com/priority", "`resourceNames.priority`"),
    ("devicePlugin", {"enabled": True}, "HAMi's chart"),
    ("devicePlugin.deviceSplitCount", 10, "`agent.splitCount`"),
    ("devicePlugin.deviceMemoryScaling", 1, "`overcommit.deviceMemoryScaling`"),
    ("devicePlugin.deviceCoreScaling", 1, "`overcommit.deviceCoreScaling`"),
    ("devicePlugin.nvidiaNodeSelector", {"gpu": "on"}, "`agent.nodeSelector`"),
    ("devicePlugin.runtimeClassName", "nvidia", "`agent.runtimeClassName`"),
    ("global.imageTag", "v2.10.0", "`image.tag`"),
    ("global.imagePullSecrets", ["regcred"], "`imagePullSecrets`"),
    ("global.labels", {}, "`podLabels`"),
    ("global.annotations", {}, "`podAnnotations`"),
    ("global.gpuHookPath", "/usr/local", "HAMi's chart"),
    ("namespaceOverride", "", "helm install -n"),
    ("podSecurityPolicy", {"enabled": False}, "no gpuslice counterpart"),
    ("device-config", {"content": ""}, "`extender.extraArgs`"),
    ("devices.nvidia.resourceCountName", "nvidia.com/gpu", "`resourceNames.count`"),
    ("devices", {"ascend": {"enabled": False}}, "`resourceNames.*`"),
    ("mockDevicePlugin", {"enabled": False}, "HAMi's chart"),
    ("legacyMetrics", False, "no gpuslice counterpart"),
    ("prometheus", {"enabled": False}, "`metrics.serviceMonitor`"),
    ("mluResourceName", "cambricon.com/vmlu", "NVIDIA GPUs only"),
    ("dcuResourceMem", "hygon.com/dcumem", "NVIDIA GPUs only"),
]


@pytest.mark.parametrize(("key", "value", "gpuslice_key"), HAMI_KEYS, ids=[k for k, _, _ in HAMI_KEYS])
def test_a_key_of_hamis_chart_fails_naming_its_gpuslice_key(
    key: str, value: object, gpuslice_key: str
) -> None:
    with pytest.raises(chart.ChartError) as err:
        chart.template({key: value})
    text = str(err.value)
    line = next((ln for ln in text.splitlines() if f"HAMi's `{key}`" in ln), None)
    assert line is not None, text
    assert gpuslice_key in line, line
    assert "docs/install.md" in text
    assert "schema" not in text, "refused by the schema, without naming the gpuslice key"


def test_the_install_page_lists_every_key_of_hamis_chart_the_chart_refuses() -> None:
    helpers = (chart.CHART_DIR / "templates" / "_helpers.tpl").read_text()
    block = helpers.split('{{- define "gpuslice.hamiKeys" -}}', 1)[1].split("{{- end -}}", 1)[0]
    mapping = dict(line.split(" => ", 1) for line in block.strip().splitlines())
    assert {key for key, _, _ in HAMI_KEYS} - {"mluResourceName", "dcuResourceMem"} <= set(mapping)
    page = (chart.CHART_DIR.parents[1] / "docs" / "install.md").read_text()
    missing = [key for key, text in mapping.items() if f"| `{key}` | {text} |" not in page]
    assert not missing, f"docs/install.md lacks rows for {missing}"


def test_a_hami_values_file_fails_listing_every_key_once(tmp_path: Any) -> None:
    """A values file like HAMi's own lists each key it sets, the most specific one only."""
    hami = {
        "global": {"imageRegistry": "", "imageTag": "v2.10.0"},
        "schedulerName": "hami-scheduler",
        "resourceMem": "nvidia.com/gpumem",
        "scheduler": {
            "leaderElect": False,
            "kubeScheduler": {"image": {"tag": ""}},
            "admissionWebhook": {"failurePolicy": "Fail"},
        },
        "devicePlugin": {"deviceSplitCount": 10},
    }
    path = tmp_path / "hami-values.yaml"
    path.write_text(yaml.safe_dump(hami))
    with pytest.raises(chart.ChartError) as err:
        chart.helm("template", "gs", str(chart.CHART_DIR), "-f", str(path))
    listed = re.findall(r"^- HAMi's `([^`]+)`", str(err.value), re.MULTILINE)
    assert listed == sorted(listed) and set(listed) == {
        "global.imageTag",
        "schedulerName",
        "resourceMem",
        "scheduler.leaderElect",
        "scheduler.kubeScheduler.image.tag",
        "scheduler.admissionWebhook.failurePolicy",
        "devicePlugin.deviceSplitCount",
    }, err.value


def test_global_image_registry_is_honoured_not_refused() -> None:
    """The one HAMi key gpuslice shares: it replaces the registry host of every image."""
    objects = chart.template({"global.imageRegistry": "mirror.example.com:5000"}, tests=True)
    images = sorted(
        {
            c["image"]
            for o in objects
            if o["kind"] in ("Deployment", "DaemonSet", "Pod")
            for c in chart.pod_spec(o)["containers"]
        }
    )
    assert images == [
        "mirror.example.com:5000/gpuslice/gpuslice:0.1.0",
        "mirror.example.com:5000/kube-scheduler:v1.34.0",
    ]


# --------------------------------------------------------------------------- kube-scheduler's tag


def _scheduler_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = chart.find(objects, "Deployment", "gpuslice")["spec"]["template"]["spec"]
    return dict(next(c for c in pod["containers"] if c["name"] == "kube-scheduler"))


@pytest.mark.parametrize(
    ("cluster", "image"),
    [
        ("v1.29.0", "registry.k8s.io/kube-scheduler:v1.29.0"),
        ("v1.30.8-eks-2d5f260", "registry.k8s.io/kube-scheduler:v1.30.8"),
        ("v1.31.4+k3s1", "registry.k8s.io/kube-scheduler:v1.31.4"),
        ("1.33.2", "registry.k8s.io/kube-scheduler:v1.33.2"),
        ("v1.36.0", "registry.k8s.io/kube-scheduler:v1.36.0"),
    ],
)
def test_the_default_kube_scheduler_is_the_clusters_version(cluster: str, image: str) -> None:
    for tag in ("", "  "):
        assert (
            _scheduler_container(chart.template({"scheduler.image.tag": tag}, kube_version=cluster))["image"]
            == image
        )


def test_the_default_kube_scheduler_on_a_live_apiserver_is_its_version(control_plane: ControlPlane) -> None:
    """What `helm install` / `helm upgrade` render: the apiserver's own version."""
    status, version = control_plane.api_request("GET", "/version")
    assert status == 200, version
    objects = chart.template(kubeconfig=control_plane.kubeconfig)
    image = _scheduler_container(objects)["image"]
    expected = re.sub(r"^(v\d+\.\d+\.\d+).*$", r"\1", version["gitVersion"])
    assert image == f"registry.k8s.io/kube-scheduler:{expected}"
    if version["gitVersion"] == "v1.34.4":
        assert image == "registry.k8s.io/kube-scheduler:v1.34.4"


@pytest.mark.parametrize(
    ("tag", "cluster", "fragment"),
    [
        ("v1.34.4", "v1.34.1", None),
        ("v1.33.9", "v1.34.1", None),
        ("v1.34.4-custom.1", "v1.34.1", None),
        ("v1.32.0", "v1.34.1", "outside the version-skew policy"),
        ("v1.35.0", "v1.34.1", "outside the version-skew policy"),
        ("v1.34.4", "v1.33.7-gke.100", "outside the version-skew policy"),
        ("v2.34.0", "v1.34.1", "outside the version-skew policy"),
        ("latest", "v1.34.1", "is not a kube-scheduler release tag"),
        ("1.34.4", "v1.34.1", "is not a kube-scheduler release tag"),
        ("v1.34", "v1.34.1", "is not a kube-scheduler release tag"),
    ],
)
def test_an_explicit_tag_must_be_within_the_version_skew_policy(
    tag: str, cluster: str, fragment: str | None
) -> None:
    if fragment is None:
        image = _scheduler_container(chart.template({"scheduler.image.tag": tag}, kube_version=cluster))[
            "image"
        ]
        assert image == f"registry.k8s.io/kube-scheduler:{tag}"
        return
    with pytest.raises(chart.ChartError) as err:
        chart.template({"scheduler.image.tag": tag}, kube_version=cluster)
    assert "scheduler.image.tag" in str(err.value) and fragment in str(err.value), err.value
    assert "version-skew-policy" in str(err.value) or "release tag" in str(err.value)


def test_standalone_mode_does_not_check_an_image_it_never_runs() -> None:
    objects = chart.template({"scheduler.enabled": False, "scheduler.image.tag": "v1.20.0"})
    pod = chart.find(objects, "Deployment", "gpuslice")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["gpuslice"]


def test_kube_scheduler_readiness_waits_for_its_caches() -> None:
    container = _scheduler_container(chart.template())
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_kube_version_constraint_matches_what_is_shipped() -> None:
    """Chart.yaml admits from 1.29, and every admitted minor renders its own kube-scheduler."""
    meta = yaml.safe_load((chart.CHART_DIR / "Chart.yaml").read_text())
    assert meta["kubeVersion"] == ">=1.29.0-0"
    with pytest.raises(chart.ChartError, match="incompatible with Kubernetes v1.28"):
        chart.template(kube_version="v1.28.9")
    for minor in range(29, 37):
        image = _scheduler_container(chart.template(kube_version=f"v1.{minor}.3-gke.1"))["image"]
        assert image == f"registry.k8s.io/kube-scheduler:v1.{minor}.3"


def test_kube_scheduler_memory_is_sized_for_large_clusters() -> None:
    resources = _scheduler_container(chart.template())["resources"]
    assert "cpu" not in resources["limits"], "a CPU limit throttles every scheduling cycle"
    assert resources["limits"]["memory"] == "4Gi"
