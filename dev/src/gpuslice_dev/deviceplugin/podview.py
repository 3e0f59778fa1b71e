"""The parts of a Pod that ``Allocate`` reads, decoded from the API's JSON (nothing more).

Besides what ``kube.objects.Pod`` holds, ``Allocate`` needs each container's literal ``env``:
HAMi's plugin skips the ``/etc/ld.so.preload`` mount for a container that sets
``CUDA_DISABLE_CONTROL`` to a true value (server.go, ``Allocate``).
"""

from __future__ import annotations

import msgspec

from gpuslice.kube import objects

DISABLE_CONTROL_ENV = "CUDA_DISABLE_CONTROL"
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
"""What Go's ``strconv.ParseBool`` reads as true."""


class EnvVar(msgspec.Struct, frozen=True, gc=False):
    """A container env entry (``valueFrom`` is not resolved: HAMi reads ``value`` only)."""

    name: str = ""
    value: str = ""


class Container(msgspec.Struct, frozen=True, gc=False):
    """A container's name and env."""

    name: str = ""
    env: tuple[EnvVar, ...] = ()


class Spec(msgspec.Struct, rename="camel", frozen=True, gc=False):
    """Node and containers."""

    node_name: str = ""
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] = ()


class Status(msgspec.Struct, frozen=True, gc=False):
    """The pod phase."""

    phase: str = ""


class Pod(msgspec.Struct, frozen=True, gc=False):
    """A pod as ``Allocate`` sees it."""

    metadata: objects.ObjectMeta = objects.ObjectMeta()
    spec: Spec = Spec()
    status: Status = Status()

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    @property
    def annotations(self) -> dict[str, str]:
        """The pod's annotations."""
        return self.metadata.annotations


class PodList(msgspec.Struct, frozen=True, gc=False):
    """A pod list."""

    items: tuple[Pod, ...] = ()


_POD = msgspec.json.Decoder(Pod)
_POD_LIST = msgspec.json.Decoder(PodList)


def decode(content: bytes) -> Pod:
    """Decode a Pod."""
    return _POD.decode(content)


def decode_list(content: bytes) -> tuple[Pod, ...]:
    """Decode a PodList's items."""
    return _POD_LIST.decode(content).items


def container_at(pod: Pod, position: int) -> Container | None:
    """The container of an annotation entry: init containers first, then app containers."""
    init = pod.spec.init_containers
    if position < len(init):
        return init[position]
    app = position - len(init)
    return pod.spec.containers[app] if app < len(pod.spec.containers) else None


def control_disabled(container: Container) -> bool:
    """True when the container sets ``CUDA_DISABLE_CONTROL`` to a value Go parses as true."""
    return any(e.name == DISABLE_CONTROL_ENV and e.value in _GO_TRUE for e in container.env)
