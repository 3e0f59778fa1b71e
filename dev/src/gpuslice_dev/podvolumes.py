"""The files a kubelet would put into a pod's volumes, as data.

``volume_content`` turns one entry of ``spec.volumes`` into a ``VolumeContent`` (a directory of
files, or a single file) without touching the disk; ``write_volume`` materializes it. Supported
kinds (Kubernetes docs "Volumes" and "Projected Volumes"):

- ``configMap`` / ``secret``: every key, or the ``items`` (key -> path, per-item ``mode``),
  ``defaultMode`` (0644), ``optional``;
- ``projected``: ``serviceAccountToken``, ``configMap``, ``secret`` and ``downwardAPI`` sources;
- ``downwardAPI``: ``fieldRef`` and ``resourceFieldRef`` items;
- ``emptyDir``: an empty directory;
- ``hostPath``: a stand-in, an empty directory (an empty file for ``type: File`` and the other
  non-directory types), since the host's devices (GPUs) are not what a test should touch.

Anything else (``persistentVolumeClaim``, ``csi``, ``image``...) is a ``PodSpecError``.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from gpuslice_dev import podenv
from gpuslice_dev.podenv import PodSpecError

DEFAULT_MODE = 0o644
"""``defaultMode`` of configMap, secret, downwardAPI and projected volumes."""

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where the kubelet mounts the service-account token, CA bundle and namespace."""

ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
"""The ConfigMap with the apiserver CA that kube-controller-manager publishes in every namespace."""

READ_ONLY_KINDS = frozenset({"configMap", "secret", "downwardAPI", "projected"})
"""Volume kinds the kubelet always mounts read-only (atomic-writer volumes)."""

FILE_HOST_PATH_TYPES = frozenset({"File", "FileOrCreate", "Socket", "CharDevice", "BlockDevice"})
"""``hostPath`` types stood in for by an empty file (the rest by an empty directory)."""

TokenMinter = Callable[[str | None, int], str]
"""``(audience or None for the apiserver's, expirationSeconds) -> token`` for the pod's service account."""


class File(msgspec.Struct, frozen=True):
    """One file of a volume."""

    path: str
    """Relative path inside the volume (may contain ``/``)."""
    data: bytes
    mode: int


class VolumeContent(msgspec.Struct, frozen=True):
    """What a volume holds."""

    kind: str
    """The volume kind (``configMap``, ``hostPath``...)."""
    shape: Literal["dir", "file"]
    files: tuple[File, ...] = ()
    """For a directory: its files (none for emptyDir / hostPath)."""
    note: str = ""
    """Set for stand-ins (``hostPath``): what was substituted, for the log."""

    @property
    def read_only(self) -> bool:
        """Whether the kubelet forces this volume read-only."""
        return self.kind in READ_ONLY_KINDS


def volume_kind(volume: Mapping[str, Any]) -> str:
    """The volume's source key (``configMap``, ``emptyDir``...).

    Raises:
        PodSpecError: none, or more than one.
    """
    kinds = [k for k in volume if k != "name"]
    if len(kinds) != 1:
        raise PodSpecError(f"volume {volume.get('name')!r} must have exactly one source, has {kinds}")
    return kinds[0]


def check_path(path: str, what: str) -> str:
    """A relative path without ``..`` elements (``validateLocalDescendingPath``).

    Raises:
        PodSpecError: an empty, absolute or escaping path.
    """
    if not path or path.startswith("/") or ".." in path.split("/"):
        raise PodSpecError(f"{what}: path {path!r} must be relative and must not contain '..'")
    return path


def _mode(value: object, default: int, what: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise PodSpecError(f"{what}: mode {value!r} must be an integer between 0 and 0777")
    return value


def _key_files(
    kind: str,
    source: Mapping[str, Any],
    *,
    name: str,
    pod: podenv.PodInfo,
    objects: podenv.Objects,
    default_mode: int,
) -> list[File]:
    """Files of a configMap or secret source (volume or projection)."""
    what = f"{kind} {pod.namespace}/{name}"
    optional = bool(source.get("optional"))
    data = podenv.source_data(objects, kind, pod.namespace, name)
    if data is None:
        if optional:
            return []
        raise PodSpecError(f"{what} not found")
    items = source.get("items")
    if not items:
        return [File(check_path(k, what), v, default_mode) for k, v in sorted(data.items())]
    files = []
    for item in items:
        key = str(item.get("key", ""))
        if key not in data:
            if optional:
                continue
            raise PodSpecError(f"{what} has no key {key!r}")
        mode = _mode(item.get("mode"), default_mode, what)
        files.append(File(check_path(str(item.get("path", "")), what), data[key], mode))
    return files


def _downward_files(
    items: Sequence[Mapping[str, Any]],
    *,
    pod: podenv.PodInfo,
    containers: Sequence[Mapping[str, Any]],
    node_allocatable: Mapping[str, str],
    default_mode: int,
) -> list[File]:
    files = []
    for item in items:
        path = check_path(str(item.get("path", "")), "downwardAPI")
        if "fieldRef" in item:
            value = podenv.field_value(pod, str(item["fieldRef"]["fieldPath"]), volume=True)
        elif "resourceFieldRef" in item:
            ref = item["resourceFieldRef"]
            if not ref.get("containerName"):
                raise PodSpecError(f"downwardAPI {path}: resourceFieldRef needs containerName")
            target = podenv.named_container(containers, str(ref["containerName"]))
            value = podenv.resource_value(target, str(ref["resource"]), ref.get("divisor"), node_allocatable)
        else:
            raise PodSpecError(f"downwardAPI {path}: needs fieldRef or resourceFieldRef")
        files.append(File(path, value.encode(), _mode(item.get("mode"), default_mode, path)))
    return files


def _unique(files: list[File], what: str) -> tuple[File, ...]:
    seen: set[str] = set()
    for f in files:
        norm = posixpath.normpath(f.path)
        if norm in seen:
            raise PodSpecError(f"{what}: more than one file at {f.path!r}")
        seen.add(norm)
    return tuple(files)


def volume_content(
    volume: Mapping[str, Any],
    *,
    pod: podenv.PodInfo,
    objects: podenv.Objects,
    containers: Sequence[Mapping[str, Any]] = (),
    node_allocatable: Mapping[str, str] | None = None,
    mint_token: TokenMinter | None = None,
) -> VolumeContent:
    """The content of one ``spec.volumes`` entry.

    Args:
        volume: the entry.
        pod: the pod's identity (downward API, namespace of the referenced objects).
        objects: ConfigMaps and Secrets.
        containers: init and regular containers (``resourceFieldRef.containerName``).
        node_allocatable: for ``resourceFieldRef`` on unset limits.
        mint_token: issues tokens for ``serviceAccountToken`` projections.

    Raises:
        PodSpecError: an unsupported kind, a missing non-optional object or key, a bad path or mode.
    """
    name = str(volume.get("name", ""))
    kind = volume_kind(volume)
    src: Mapping[str, Any] = volume[kind] or {}
    alloc = node_allocatable or {}
    if kind in ("configMap", "secret"):
        obj_kind = "ConfigMap" if kind == "configMap" else "Secret"
        obj_name = str(src.get("name" if kind == "configMap" else "secretName", ""))
        mode = _mode(src.get("defaultMode"), DEFAULT_MODE, f"volume {name}")
        files = _key_files(obj_kind, src, name=obj_name, pod=pod, objects=objects, default_mode=mode)
        return VolumeContent(kind, "dir", _unique(files, f"volume {name}"))
    if kind == "downwardAPI":
        mode = _mode(src.get("defaultMode"), DEFAULT_MODE, f"volume {name}")
        files = _downward_files(
            src.get("items") or (), pod=pod, containers=containers, node_allocatable=alloc, default_mode=mode
        )
        return VolumeContent(kind, "dir", _unique(files, f"volume {name}"))
    if kind == "projected":
        mode = _mode(src.get("defaultMode"), DEFAULT_MODE, f"volume {name}")
        files = []
        for source in src.get("sources") or ():
            files.extend(
                _projection(
                    source,
                    pod=pod,
                    objects=objects,
                    containers=containers,
                    node_allocatable=alloc,
                    mint_token=mint_token,
                    default_mode=mode,
                    volume=name,
                )
            )
        return VolumeContent(kind, "dir", _unique(files, f"volume {name}"))
    if kind == "emptyDir":
        return VolumeContent(kind, "dir")
    if kind == "hostPath":
        path, host_type = str(src.get("path", "")), str(src.get("type") or "")
        shape: Literal["dir", "file"] = "file" if host_type in FILE_HOST_PATH_TYPES else "dir"
        note = f"hostPath {path} (type {host_type or 'unset'}) stood in for by an empty {shape}"
        return VolumeContent(kind, shape, note=note)
    raise PodSpecError(f"volume {name!r}: kind {kind!r} is not supported by podrun")


def _projection(
    source: Mapping[str, Any],
    *,
    pod: podenv.PodInfo,
    objects: podenv.Objects,
    containers: Sequence[Mapping[str, Any]],
    node_allocatable: Mapping[str, str],
    mint_token: TokenMinter | None,
    default_mode: int,
    volume: str,
) -> list[File]:
    kinds = list(source)
    if len(kinds) != 1:
        raise PodSpecError(f"volume {volume}: a projected source needs exactly one kind, has {kinds}")
    kind = kinds[0]
    src: Mapping[str, Any] = source[kind] or {}
    if kind in ("configMap", "secret"):
        obj_kind = "ConfigMap" if kind == "configMap" else "Secret"
        name = str(src.get("name", ""))
        return _key_files(obj_kind, src, name=name, pod=pod, objects=objects, default_mode=default_mode)
    if kind == "downwardAPI":
        return _downward_files(
            src.get("items") or (),
            pod=pod,
            containers=containers,
            node_allocatable=node_allocatable,
            default_mode=default_mode,
        )
    if kind == "serviceAccountToken":
        if mint_token is None:
            raise PodSpecError(f"volume {volume}: serviceAccountToken projected without a token minter")
        expiration = int(src.get("expirationSeconds") or 3600)
        if expiration < 600:
            raise PodSpecError(f"volume {volume}: expirationSeconds must be at least 600")
        audience = src.get("audience") or None
        token = mint_token(None if audience is None else str(audience), expiration)
        path = check_path(str(src.get("path", "")), f"volume {volume}")
        return [File(path, token.encode(), default_mode)]
    raise PodSpecError(f"volume {volume}: projected source {kind!r} is not supported by podrun")


def service_account_volume(name: str, expiration_seconds: int = 3600) -> dict[str, Any]:
    """The projected volume the ServiceAccount admission plugin adds (``kube-api-access-*``).

    A token, the apiserver CA from ConfigMap ``kube-root-ca.crt`` and the namespace, mounted at
    ``SERVICE_ACCOUNT_DIR`` (Kubernetes docs "Service account token volume projection").
    """
    return {
        "name": name,
        "projected": {
            "defaultMode": DEFAULT_MODE,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": expiration_seconds, "path": "token"}},
                {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                    }
                },
            ],
        },
    }


def write_volume(content: VolumeContent, path: Path) -> None:
    """Materialize ``content`` at ``path`` (which must not exist): a directory tree or one file."""
    if content.shape == "file":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o644, exist_ok=False)
        return
    path.mkdir(parents=True, mode=0o755)
    for f in content.files:
        target = path / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.data)
        os.chmod(target, f.mode)
