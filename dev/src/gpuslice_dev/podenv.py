"""What the kubelet computes for a container before it starts: environment, argv, downward API.

Pure functions over the plain dicts of a rendered Pod template (as ``helm template`` prints
them), used by ``devcluster.podrun`` to run a chart's containers as local processes. They follow
the kubelet's rules (``pkg/kubelet/kubelet_pods.go`` ``makeEnvironmentVariables``, Kubernetes
docs "Define Dependent Environment Variables" and "Expose Pod Information to Containers Through
Environment Variables"):

- ``envFrom`` first, then ``env`` in order, later definitions win;
- ``$(VAR)`` in an ``env`` value expands only variables defined before it (and the service
  variables), ``$$`` escapes, an unknown reference stays verbatim
  (``third_party/forked/golang/expansion/expand.go``); ``valueFrom`` values are never expanded;
- ``command`` and ``args`` expand against the container's final environment;
- ``resourceFieldRef`` rounds up (``pkg/api/v1/resource/helpers.go``
  ``ExtractContainerResourceValue``), and an unset limit is the node's allocatable.

Objects referenced by name (ConfigMaps, Secrets) come from an ``Objects`` source.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any, Protocol

import msgspec

from gpuslice.codec import errors as codec_errors
from gpuslice.codec import goparse, quantity


class PodSpecError(ValueError):
    """The pod template cannot be run as written (the kubelet would refuse it too)."""


class PodInfo(msgspec.Struct, frozen=True):
    """The pod's identity and placement, the values the downward API exposes."""

    name: str
    namespace: str
    uid: str
    node_name: str
    service_account: str
    pod_ip: str = "127.0.0.1"
    host_ip: str = "127.0.0.1"
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


class Objects(Protocol):
    """Where ConfigMaps and Secrets referenced by a pod are looked up."""

    def get(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The object ``kind`` (``ConfigMap`` or ``Secret``) ``namespace/name``, or None."""
        ...


class ManifestObjects:
    """Objects from a list of rendered manifests, then from a fallback.

    A manifest without ``metadata.namespace`` (``helm template`` leaves it out unless the chart
    writes it) is in every namespace, as it is in the release namespace once applied.

    Args:
        manifests: the rendered objects (``None`` entries, empty YAML documents, are skipped).
        fallback: asked when no manifest matches (e.g. the live API), or None.
    """

    def __init__(
        self,
        manifests: Iterable[Mapping[str, Any] | None],
        fallback: Callable[[str, str, str], Mapping[str, Any] | None] | None = None,
    ) -> None:
        self._exact: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        self._anywhere: dict[tuple[str, str], Mapping[str, Any]] = {}
        for obj in manifests:
            if not obj:
                continue
            meta = obj.get("metadata") or {}
            kind, name, ns = str(obj.get("kind", "")), str(meta.get("name", "")), meta.get("namespace")
            if ns:
                self._exact[(kind, str(ns), name)] = obj
            else:
                self._anywhere[(kind, name)] = obj
        self._fallback = fallback

    def get(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The manifest ``kind`` ``namespace/name``, else the fallback's answer."""
        found = self._exact.get((kind, namespace, name)) or self._anywhere.get((kind, name))
        if found is None and self._fallback is not None:
            found = self._fallback(kind, namespace, name)
        return found


def configmap_data(obj: Mapping[str, Any]) -> dict[str, bytes]:
    """A ConfigMap's keys: ``data`` (text) and ``binaryData`` (base64)."""
    out = {str(k): str(v).encode() for k, v in (obj.get("data") or {}).items()}
    for k, v in (obj.get("binaryData") or {}).items():
        out[str(k)] = base64.b64decode(str(v), validate=True)
    return out


def secret_data(obj: Mapping[str, Any]) -> dict[str, bytes]:
    """A Secret's keys: ``data`` (base64), overridden by ``stringData`` (plain, as the API merges it)."""
    out = {str(k): base64.b64decode(str(v), validate=True) for k, v in (obj.get("data") or {}).items()}
    for k, v in (obj.get("stringData") or {}).items():
        out[str(k)] = str(v).encode()
    return out


def source_data(objects: Objects, kind: str, namespace: str, name: str) -> dict[str, bytes] | None:
    """The keys of ConfigMap or Secret ``namespace/name``, or None when it does not exist."""
    obj = objects.get(kind, namespace, name)
    if obj is None:
        return None
    return configmap_data(obj) if kind == "ConfigMap" else secret_data(obj)


def decode_value(data: bytes) -> str:
    """Bytes as an environment value (invalid UTF-8 kept byte for byte, as ``os.fsencode`` restores it)."""
    return data.decode("utf-8", "surrogateescape")


# ----------------------------------------------------------------- $(VAR) expansion


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``third_party/forked/golang/expansion/expand.go``).

    ``$(NAME)`` becomes ``lookup(NAME)``, or stays ``$(NAME)`` when that is None; ``$$`` becomes
    ``$``; any other ``$`` and an unclosed ``$(`` are kept.

    Args:
        text: the value, command or argument.
        lookup: the variables visible at this point.

    Returns:
        The expanded text.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:
                out.append("$(")
                i += 2
            else:
                name = text[i + 2 : close]
                value = lookup(name)
                out.append(f"$({name})" if value is None else value)
                i = close + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


# ----------------------------------------------------------------- downward API

_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.*)'\]$")
ENV_FIELDS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.hostIP",
        "status.hostIPs",
        "status.podIP",
        "status.podIPs",
    }
)
"""``fieldRef`` paths an environment variable may use (besides ``metadata.labels['k']`` etc.)."""
VOLUME_FIELDS = frozenset(
    {"metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations"}
)
"""``fieldRef`` paths a downwardAPI volume file may use (besides the subscripted maps)."""


def format_map(values: Mapping[str, str]) -> str:
    """Go ``fieldpath.FormatMap``: ``key="value"`` lines sorted by key, values quoted like ``%q``."""
    return "\n".join(f"{key}={goparse.quote(values[key])}" for key in sorted(values))


def field_value(pod: PodInfo, field_path: str, *, volume: bool = False) -> str:
    """The value of a ``fieldRef`` (kubelet ``podFieldSelectorRuntimeValue`` / ``ExtractFieldPathAsString``).

    Args:
        pod: the pod.
        field_path: e.g. ``metadata.name`` or ``metadata.labels['app']``.
        volume: a downwardAPI volume item (whole label/annotation maps allowed; spec/status not).

    Raises:
        PodSpecError: an unsupported path for this use.
    """
    sub = _SUBSCRIPT.match(field_path)
    if sub:
        values = pod.labels if sub.group(1) == "labels" else pod.annotations
        return values.get(sub.group(2), "")
    if field_path not in (VOLUME_FIELDS if volume else ENV_FIELDS):
        where = "a downwardAPI volume" if volume else "an environment variable"
        raise PodSpecError(f"fieldRef {field_path!r} is not supported in {where}")
    simple = {
        "metadata.name": pod.name,
        "metadata.namespace": pod.namespace,
        "metadata.uid": pod.uid,
        "spec.nodeName": pod.node_name,
        "spec.serviceAccountName": pod.service_account,
        "status.hostIP": pod.host_ip,
        "status.hostIPs": pod.host_ip,
        "status.podIP": pod.pod_ip,
        "status.podIPs": pod.pod_ip,
    }
    if field_path in simple:
        return simple[field_path]
    return format_map(pod.labels if field_path == "metadata.labels" else pod.annotations)


_LIMITED_BY_NODE = ("cpu", "memory", "ephemeral-storage")


def effective_resources(
    container: Mapping[str, Any], node_allocatable: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """The (requests, limits) the kubelet sees for a container.

    The API defaults a missing request to its limit (``SetDefaults_Pod``); the kubelet then
    treats a missing cpu, memory or ephemeral-storage limit as the node's allocatable
    (``MergeContainerResourceLimits``).
    """
    resources = container.get("resources") or {}
    limits = {str(k): str(v) for k, v in (resources.get("limits") or {}).items()}
    requests = {str(k): str(v) for k, v in (resources.get("requests") or {}).items()}
    for name, value in limits.items():
        requests.setdefault(name, value)
    for name in _LIMITED_BY_NODE:
        if name not in limits and name in node_allocatable:
            limits[name] = str(node_allocatable[name])
    return requests, limits


def _quantity(text: str, what: str) -> Fraction:
    try:
        return quantity.parse(text, what)
    except codec_errors.DecodeError as exc:
        raise PodSpecError(str(exc)) from exc


def resource_value(
    container: Mapping[str, Any],
    resource: str,
    divisor: object,
    node_allocatable: Mapping[str, str],
) -> str:
    """The value of a ``resourceFieldRef`` (``ExtractContainerResourceValue``): rounded up, divided.

    Args:
        container: the container named by the reference.
        resource: ``limits.cpu``, ``requests.memory``, ``limits.ephemeral-storage``,
            ``requests.hugepages-2Mi``...
        divisor: the divisor quantity (``None``, ``0`` or ``""``: 1).
        node_allocatable: the node's allocatable, used for missing limits.

    Raises:
        PodSpecError: an unsupported resource or a bad quantity.
    """
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not (name in _LIMITED_BY_NODE or name.startswith("hugepages-")):
        raise PodSpecError(f"unsupported container resource: {resource}")
    requests, limits = effective_resources(container, node_allocatable)
    amount = _quantity((limits if kind == "limits" else requests).get(name, "0"), resource)
    div = _quantity(str(divisor), "divisor") if divisor not in (None, "", 0, "0") else Fraction(1)
    if div <= 0:
        raise PodSpecError(f"resourceFieldRef {resource}: divisor must be positive")
    if name == "cpu":
        num, den = quantity.milli_value(amount), quantity.milli_value(div)
    else:
        num, den = quantity.value(amount), quantity.value(div)
    return str(math.ceil(Fraction(num, den)))


def named_container(containers: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    """The container (or init container) called ``name``.

    Raises:
        PodSpecError: none has that name.
    """
    for c in containers:
        if c.get("name") == name:
            return c
    raise PodSpecError(f"resourceFieldRef names container {name!r}, which the pod does not have")


# ----------------------------------------------------------------- environment


def service_env(host: str, port: int) -> dict[str, str]:
    """The variables of the ``kubernetes`` Service every container gets (``getServiceEnvVarMap``)."""
    prefix = f"KUBERNETES_PORT_{port}_TCP"
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        "KUBERNETES_PORT": f"tcp://{host}:{port}",
        prefix: f"tcp://{host}:{port}",
        f"{prefix}_PROTO": "tcp",
        f"{prefix}_PORT": str(port),
        f"{prefix}_ADDR": host,
    }


def _key_ref(objects: Objects, kind: str, namespace: str, ref: Mapping[str, Any]) -> str | None:
    """A ``configMapKeyRef``/``secretKeyRef`` value, None when optional and absent."""
    name, key, optional = str(ref.get("name", "")), str(ref.get("key", "")), bool(ref.get("optional"))
    data = source_data(objects, kind, namespace, name)
    if data is None:
        if optional:
            return None
        raise PodSpecError(f"{kind} {namespace}/{name} not found")
    if key not in data:
        if optional:
            return None
        raise PodSpecError(f"couldn't find key {key} in {kind} {namespace}/{name}")
    return decode_value(data[key])


def container_env(
    container: Mapping[str, Any],
    *,
    pod: PodInfo,
    objects: Objects,
    all_containers: Sequence[Mapping[str, Any]],
    services: Mapping[str, str],
    node_allocatable: Mapping[str, str],
) -> dict[str, str]:
    """The variables the kubelet passes to a container (``makeEnvironmentVariables``).

    Args:
        container: the container.
        pod: the pod's identity (for ``fieldRef``).
        objects: ConfigMaps and Secrets.
        all_containers: init and regular containers (``resourceFieldRef.containerName``).
        services: service variables (``service_env``); added unless the container defines them.
        node_allocatable: for ``resourceFieldRef`` on unset limits.

    Returns:
        Name to value, ``envFrom`` and ``env`` first, then the service variables.

    Raises:
        PodSpecError: a missing non-optional ConfigMap, Secret or key, or an unsupported reference.
    """
    ns = pod.namespace
    env: dict[str, str] = {}
    for source in container.get("envFrom") or ():
        prefix = str(source.get("prefix") or "")
        if "configMapRef" in source:
            kind, ref = "ConfigMap", source["configMapRef"] or {}
        elif "secretRef" in source:
            kind, ref = "Secret", source["secretRef"] or {}
        else:
            raise PodSpecError(f"envFrom entry {dict(source)} names neither configMapRef nor secretRef")
        data = source_data(objects, kind, ns, str(ref.get("name", "")))
        if data is None:
            if ref.get("optional"):
                continue
            raise PodSpecError(f"{kind} {ns}/{ref.get('name')} not found (envFrom)")
        for key in sorted(data):
            name = prefix + key
            if name and "=" not in name:  # the kubelet skips invalid names with an event
                env[name] = decode_value(data[key])

    def lookup(name: str) -> str | None:
        return env.get(name, services.get(name))

    for var in container.get("env") or ():
        name = str(var["name"])
        source = var.get("valueFrom")
        if not source:
            env[name] = expand(str(var.get("value") or ""), lookup)
            continue
        value: str | None
        if "fieldRef" in source:
            value = field_value(pod, str(source["fieldRef"]["fieldPath"]))
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            target = container
            if ref.get("containerName"):
                target = named_container(all_containers, str(ref["containerName"]))
            value = resource_value(target, str(ref["resource"]), ref.get("divisor"), node_allocatable)
        elif "configMapKeyRef" in source:
            value = _key_ref(objects, "ConfigMap", ns, source["configMapKeyRef"])
        elif "secretKeyRef" in source:
            value = _key_ref(objects, "Secret", ns, source["secretKeyRef"])
        else:
            raise PodSpecError(f"env {name}: unsupported valueFrom {sorted(source)}")
        if value is not None:
            env[name] = value
    for name, value in services.items():
        env.setdefault(name, value)
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded against the final environment.

    Raises:
        PodSpecError: no ``command`` (the image's entrypoint is unknown outside a runtime).
    """
    command = [str(c) for c in container.get("command") or ()]
    if not command:
        raise PodSpecError(
            f"container {container.get('name')!r} has no command; the image entrypoint is unknown here"
        )
    args = [str(a) for a in container.get("args") or ()]
    return [expand(part, env.get) for part in command + args]
