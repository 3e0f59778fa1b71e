"""``gpuslice-dev device-plugin`` / ``python -m gpuslice_dev.deviceplugin``: the command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable

from gpuslice.agent import backend, discover
from gpuslice.agent import cli as agent_cli
from gpuslice.kube import client as kclient
from gpuslice_dev.deviceplugin import allocator, plugin, responses, service

log = logging.getLogger("gpuslice.deviceplugin")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plugin's options."""
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME"), help="this Node (env NODE_NAME)")
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster or KUBECONFIG)"
    )
    parser.add_argument(
        "--socket-dir", default=plugin.DEVICE_PLUGIN_PATH, help="kubelet's device-plugin directory"
    )
    parser.add_argument("--resource-name", default="nvidia.com/gpu", help="extended resource to advertise")
    parser.add_argument("--split-count", type=int, default=10, help="slots per card (deviceSplitCount)")
    parser.add_argument(
        "--memory-scaling",
        type=float,
        default=1.0,
        help="registered memory = MiB x this (deviceMemoryScaling)",
    )
    parser.add_argument(
        "--core-scaling", type=float, default=1.0, help="registered cores = 100 x this (deviceCoreScaling)"
    )
    parser.add_argument(
        "--backend",
        default="nvml",
        choices=agent_cli.BACKENDS,
        help="card source: NVML (libnvidia-ml.so.1 from the library path), or a recorded machine shape",
    )
    parser.add_argument(
        "--hami-dir",
        default="/usr/local/vgpu",
        help="host dir with libvgpu.so, ld.so.preload and the per-container cache dirs "
        "(HAMi's /usr/local/vgpu)",
    )
    parser.add_argument(
        "--dev-dir", default="/dev", help="host dir holding nvidia<i>, nvidiactl, nvidia-uvm..."
    )
    parser.add_argument("--lock-dir", default="/tmp/vgpulock", help="host dir mounted at /tmp/vgpulock")
    parser.add_argument(
        "--hook-path", default="/usr/local", help="container-side prefix of vgpu/ (HAMi's HOOK_PATH)"
    )
    parser.add_argument(
        "--libcuda-log-level",
        default="1",
        help="LIBCUDA_LOG_LEVEL for containers ('' = unset; HAMi chart: 1)",
    )
    parser.add_argument(
        "--disable-core-limit", action="store_true", help="set GPU_CORE_UTILIZATION_POLICY=disable"
    )
    parser.add_argument(
        "--pass-device-specs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hand out /dev/nvidia* device nodes (HAMi's PASS_DEVICE_SPECS)",
    )
    parser.add_argument(
        "--numa-topology",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send each card's NUMA node to kubelet (HAMi's enableNumaTopology)",
    )
    parser.add_argument(
        "--preferred-allocation",
        action="store_true",
        help="HAMi's enableGetPreferredAllocation: advertise it in Register and give containers "
        "the cards of kubelet's device IDs",
    )
    parser.add_argument(
        "--health-quiet-period",
        type=float,
        default=300.0,
        help="seconds without faults before a card is healthy",
    )
    parser.add_argument(
        "--report-period", type=float, default=30.0, help="seconds between Node annotation reports"
    )
    parser.add_argument(
        "--kube-qps",
        type=float,
        default=kclient.DEFAULT_QPS,
        help="client-side API rate limit; HAMi's plugin runs at client-go's default, 5 (burst 10)",
    )
    parser.add_argument("--kube-burst", type=int, default=kclient.DEFAULT_BURST, help="client-side API burst")
    parser.add_argument("--log-level", default="INFO", help="logging level")


def settings(args: argparse.Namespace, node: str) -> service.Settings:
    """Settings from parsed arguments.

    Raises:
        ValueError: an invalid value (split count, scaling).
    """
    return service.Settings(
        endpoint=plugin.Endpoint(
            socket_dir=args.socket_dir,
            resource_name=args.resource_name,
            preferred_allocation=args.preferred_allocation,
        ),
        registration=discover.RegistrationConfig(
            split_count=args.split_count, memory_scaling=args.memory_scaling, core_scaling=args.core_scaling
        ),
        allocate=allocator.Settings(
            node=node,
            options=responses.Options(
                memory_scaling=args.memory_scaling,
                libcuda_log_level=args.libcuda_log_level,
                disable_core_limit=args.disable_core_limit,
                pass_device_specs=args.pass_device_specs,
            ),
            paths=responses.Paths(
                hami_dir=os.path.abspath(args.hami_dir),
                dev_dir=os.path.abspath(args.dev_dir),
                lock_dir=os.path.abspath(args.lock_dir),
                hook_path=args.hook_path,
            ),
            align_to_kubelet=args.preferred_allocation,
        ),
        numa_topology=args.numa_topology,
        quiet_period_s=args.health_quiet_period,
        report_period_s=args.report_period,
    )


def main(args: argparse.Namespace) -> int:
    """Run the plugin until SIGTERM or SIGINT; returns the exit status."""
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.node_name:
        print("gpuslice-dev device-plugin: set --node-name or NODE_NAME", file=sys.stderr)
        return 2
    try:
        config = settings(args, args.node_name)
        open_backend = agent_cli.open_backend(args.backend)
    except (ValueError, KeyError) as exc:
        print(f"gpuslice-dev device-plugin: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(config, open_backend, args.kubeconfig, args.kube_qps, args.kube_burst))


async def _serve(
    config: service.Settings,
    open_backend: Callable[[], backend.Backend],
    kubeconfig: str | None,
    qps: float = kclient.DEFAULT_QPS,
    burst: int = kclient.DEFAULT_BURST,
) -> int:
    try:
        kube = kclient.KubeClient.auto(kubeconfig, qps=qps, burst=burst)
    except Exception as exc:  # kubeconfig problems come as several exception types
        print(f"gpuslice-dev device-plugin: cannot configure the API client: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _stopper(stop, signum))
    try:
        await service.Service(config, open_backend, kube).run(stop)
    finally:
        await kube.aclose()
    return 0


def _stopper(stop: asyncio.Event, signum: int) -> Callable[[], None]:
    def handler() -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    return handler
