"""What one container gets from ``Allocate``: HAMi-core's env, mounts and device nodes (pure).

Every rule is HAMi's NVIDIA plugin (``pkg/device-plugin/nvidiadevice/nvinternal/plugin``,
server.go ``Allocate`` and ``getAllocateResponse``, util.go ``GetLibPath``), in hami-core mode
with the chart's defaults (``deviceListStrategy: envvar``, ``deviceIDStrategy: uuid``):

env
    ``NVIDIA_VISIBLE_DEVICES``: the container's card UUIDs, comma-separated, first-seen order
    (``updateResponseForDeviceListEnvVar``); ``CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`` per card in
    annotation order; ``CUDA_DEVICE_SM_LIMIT``: cores of the first card;
    ``CUDA_DEVICE_MEMORY_SHARED_CACHE=<hook>/vgpu/<random uuid>.cache``;
    ``CUDA_OVERSUBSCRIBE=true`` when memory scaling > 1; ``LIBCUDA_LOG_LEVEL`` when set (the chart
    sets 1); ``GPU_CORE_UTILIZATION_POLICY=disable`` with ``--disable-core-limit``. HAMi sets no
    ``CUDA_VISIBLE_DEVICES``.
mounts
    ``<hook>/vgpu/libvgpu.so`` (ro) from the host library; ``<hook>/vgpu`` (rw) from a fresh
    per-container dir ``<hami-dir>/containers/<pod uid>_<container>``; ``/tmp/vgpulock`` (rw) from
    the host lock dir; ``/etc/ld.so.preload`` (ro) from ``<hami-dir>/ld.so.preload`` unless the
    container sets ``CUDA_DISABLE_CONTROL`` true; ``/tmp/license`` and ``/usr/bin/vgpuvalidator``
    (ro) when ``<hami-dir>/license`` exists.
devices (``apiDeviceSpecs``, HAMi's ``PASS_DEVICE_SPECS=true``)
    ``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``, ``/dev/nvidia-modeset``,
    each only when present on the host, then ``/dev/nvidia<index>`` per card; permissions ``rw``.

A container holding MIG instances (HAMi's MIG mode) gets ``NVIDIA_VISIBLE_DEVICES`` naming its MIG
devices by MIG UUID and nothing of HAMi-core: no limits, no mounts (``Allocate`` skips them when the
operating mode is ``mig``); its device nodes are the control devices and its parent cards'.

HAMi's hook path is one directory seen alike by the plugin and the host (``/usr/local``, so
``/usr/local/vgpu``). gpuslice splits it: ``hami_dir`` is the host directory (what the chart
mounts at ``/usr/local/vgpu``) and ``hook_path`` the prefix containers see.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable, Mapping

from gpuslice.model import allocations
from gpuslice_dev.deviceplugin.v1beta1 import api_pb2

CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""Device nodes every container gets when they exist (``GetDevicePaths``; all optional in HAMi)."""
LOCK_MOUNT = "/tmp/vgpulock"
PRELOAD_MOUNT = "/etc/ld.so.preload"


@dataclasses.dataclass(frozen=True)
class Paths:
    """Host and container paths for what ``Allocate`` hands out.

    Attributes:
        hami_dir: host directory holding ``libvgpu.so``, ``ld.so.preload`` and the per-container
            shared-cache dirs (HAMi's ``/usr/local/vgpu``).
        dev_dir: host directory holding the device nodes (``/dev``).
        lock_dir: host directory mounted at ``/tmp/vgpulock``.
        hook_path: the container-side prefix (HAMi's ``HOOK_PATH``): libvgpu goes to
            ``<hook_path>/vgpu/libvgpu.so``.
    """

    hami_dir: str = "/usr/local/vgpu"
    dev_dir: str = "/dev"
    lock_dir: str = "/tmp/vgpulock"
    hook_path: str = "/usr/local"

    @property
    def container_vgpu(self) -> str:
        """``<hook_path>/vgpu`` inside the container."""
        return posixpath.join(self.hook_path, "vgpu")

    def cache_dir(self, pod_uid: str, container: str) -> str:
        """The host dir mounted at ``<hook>/vgpu`` for one container (``containers/<uid>_<name>``)."""
        return posixpath.join(self.hami_dir, "containers", f"{pod_uid}_{container}")


@dataclasses.dataclass(frozen=True)
class Options:
    """Plugin settings that shape the answer.

    Attributes:
        memory_scaling: ``deviceMemoryScaling``; above 1 the container may oversubscribe.
        libcuda_log_level: ``LIBCUDA_LOG_LEVEL`` ('' = not set).
        disable_core_limit: HAMi's ``--disable-core-limit``.
        pass_device_specs: hand out device nodes (HAMi's ``PASS_DEVICE_SPECS``); without an NVIDIA
            container runtime nothing else puts them in the container.
    """

    memory_scaling: float = 1.0
    libcuda_log_level: str = "1"
    disable_core_limit: bool = False
    pass_device_specs: bool = True


@dataclasses.dataclass(frozen=True)
class Container:
    """One container being allocated.

    Attributes:
        pod_uid: the pod's UID.
        name: the container's name.
        grants: its cards, in annotation order.
        control_disabled: the container sets ``CUDA_DISABLE_CONTROL`` true.
        mig_uuids: the MIG devices it was given, in device order (empty: HAMi-core shares).
    """

    pod_uid: str
    name: str
    grants: allocations.ContainerAllocation
    control_disabled: bool = False
    mig_uuids: tuple[str, ...] = ()


def envs(c: Container, options: Options, paths: Paths, cache_id: str) -> dict[str, str]:
    """The container's env (see the module docstring)."""
    if c.mig_uuids:
        return {"NVIDIA_VISIBLE_DEVICES": ",".join(c.mig_uuids)}
    uuids = list(dict.fromkeys(g.uuid for g in c.grants))
    out = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}
    for i, grant in enumerate(c.grants):
        out[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{grant.memory_mib}m"
    out["CUDA_DEVICE_SM_LIMIT"] = str(c.grants[0].cores)
    out["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = posixpath.join(paths.container_vgpu, f"{cache_id}.cache")
    if options.memory_scaling > 1:
        out["CUDA_OVERSUBSCRIBE"] = "true"
    if options.libcuda_log_level:
        out["LIBCUDA_LOG_LEVEL"] = options.libcuda_log_level
    if options.disable_core_limit:
        out["GPU_CORE_UTILIZATION_POLICY"] = "disable"
    return out


def mounts(c: Container, paths: Paths, exists: Callable[[str], bool]) -> list[api_pb2.Mount]:
    """The container's mounts (see the module docstring)."""
    if c.mig_uuids:
        return []
    vgpu = paths.container_vgpu
    out = [
        api_pb2.Mount(
            container_path=posixpath.join(vgpu, "libvgpu.so"),
            host_path=posixpath.join(paths.hami_dir, "libvgpu.so"),
            read_only=True,
        ),
        api_pb2.Mount(container_path=vgpu, host_path=paths.cache_dir(c.pod_uid, c.name), read_only=False),
        api_pb2.Mount(container_path=LOCK_MOUNT, host_path=paths.lock_dir, read_only=False),
    ]
    if not c.control_disabled:
        out.append(
            api_pb2.Mount(
                container_path=PRELOAD_MOUNT,
                host_path=posixpath.join(paths.hami_dir, "ld.so.preload"),
                read_only=True,
            )
        )
    license_path = posixpath.join(paths.hami_dir, "license")
    if exists(license_path):
        out.append(api_pb2.Mount(container_path="/tmp/license", host_path=license_path, read_only=True))
        out.append(
            api_pb2.Mount(
                container_path="/usr/bin/vgpuvalidator",
                host_path=posixpath.join(paths.hami_dir, "vgpuvalidator"),
                read_only=True,
            )
        )
    return out


def device_specs(
    c: Container, index_of: Mapping[str, int], paths: Paths, exists: Callable[[str], bool]
) -> list[api_pb2.DeviceSpec]:
    """Control devices present on the host, then ``/dev/nvidia<index>`` per card (first-seen order).

    Raises:
        KeyError: a card UUID that ``index_of`` does not know.
    """
    out: list[api_pb2.DeviceSpec] = []
    for name in CONTROL_DEVICES:
        host = posixpath.join(paths.dev_dir, name)
        if exists(host):
            out.append(api_pb2.DeviceSpec(container_path=f"/dev/{name}", host_path=host, permissions="rw"))
    for uuid in dict.fromkeys(g.uuid for g in c.grants):
        name = f"nvidia{index_of[uuid]}"
        out.append(
            api_pb2.DeviceSpec(
                container_path=f"/dev/{name}", host_path=posixpath.join(paths.dev_dir, name), permissions="rw"
            )
        )
    return out


def container_response(
    c: Container,
    options: Options,
    paths: Paths,
    index_of: Mapping[str, int],
    cache_id: str,
    exists: Callable[[str], bool],
) -> api_pb2.ContainerAllocateResponse:
    """The whole answer for one container.

    Raises:
        KeyError: a card UUID that ``index_of`` does not know (only with device specs).
    """
    specs = device_specs(c, index_of, paths, exists) if options.pass_device_specs else []
    return api_pb2.ContainerAllocateResponse(
        envs=envs(c, options, paths, cache_id), mounts=mounts(c, paths, exists), devices=specs
    )
