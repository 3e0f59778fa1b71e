"""``gpuslice agent``: the node agent's command line (run as a DaemonSet on every GPU node)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

import msgspec

from gpuslice.agent import backend, discover, fake, health, metrics, server, service
from gpuslice.codec import keys
from gpuslice.kube import nodes

log = logging.getLogger("gpuslice.agent")

BACKENDS = ("nvml", *(f"fake:{name}" for name in sorted(fake.SHAPES)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The agent's options."""
    parser.add_argument(
        "--node-name", default=os.environ.get("NODE_NAME"), help="Node to annotate (env NODE_NAME)"
    )
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster or KUBECONFIG)"
    )
    parser.add_argument(
        "--register",
        action="store_true",
        help=(
            "also write hami.io/node-nvidia-register (for clusters without HAMi's device plugin; "
            "refused, with a warning, while another field manager owns that annotation)"
        ),
    )
    parser.add_argument("--split-count", type=int, default=10, help="slots per card in the registration")
    parser.add_argument("--memory-scaling", type=float, default=1.0, help="registered memory = MiB x this")
    parser.add_argument("--core-scaling", type=float, default=1.0, help="registered cores = 100 x this")
    parser.add_argument(
        "--mig-profiles",
        action="append",
        default=[],
        metavar="MODELS=PROFILES",
        help=(
            "MIG profiles cards in MIG mode register, HAMi's migProfileAllowlist: e.g. "
            "'A100-SXM4-40GB,A100-PCIE-40GB=1g.5gb,2g.10gb,3g.20gb,7g.40gb' (repeatable; the first "
            "entry naming a card's model applies; default: every profile NVML offers)"
        ),
    )
    parser.add_argument("--refresh", type=float, default=300.0, help="discovery period in seconds")
    parser.add_argument("--telemetry-interval", type=float, default=60.0, help="telemetry period in seconds")
    parser.add_argument(
        "--health-quiet-period",
        type=float,
        default=300.0,
        help="seconds without faults before a card is healthy",
    )
    parser.add_argument(
        "--ignore-xids",
        default=",".join(str(x) for x in sorted(health.APPLICATION_XIDS)),
        help="comma-separated XIDs that are not device faults",
    )
    parser.add_argument(
        "--backend", default="nvml", choices=BACKENDS, help="NVML, or a recorded machine shape"
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:9400", help="HOST:PORT for /metrics, /healthz, POST /refresh"
    )
    parser.add_argument(
        "--once", action="store_true", help="publish once, print the annotations as JSON, exit"
    )
    parser.add_argument("--dry-run", action="store_true", help="do not touch the API (with --once)")
    parser.add_argument("--log-level", default="INFO", help="logging level")


def open_backend(spec: str) -> Callable[[], backend.Backend]:
    """A factory for the backend named on the command line (fake shapes are checked now)."""
    if spec.startswith("fake:"):
        machine = fake.shape(spec.removeprefix("fake:"))
        instance = fake.FakeBackend(machine)
        return lambda: instance
    if spec != "nvml":
        raise ValueError(f"unknown backend {spec!r}; known: {', '.join(BACKENDS)}")

    def real() -> backend.Backend:
        from gpuslice.agent import nvml  # imported only when asked for

        return nvml.NvmlBackend()

    return real


def parse_mig_allowlist(spec: str) -> discover.MigAllowlist:
    """``MODEL[,MODEL...]=PROFILE[,PROFILE...]`` as an allowlist entry; raises ``ValueError``."""
    models, eq, profiles = spec.partition("=")
    if not eq:
        raise ValueError(f"--mig-profiles {spec!r}: expected MODELS=PROFILES")
    return discover.MigAllowlist(
        models=tuple(m.strip() for m in models.split(",") if m.strip()),
        profiles=tuple(p.strip() for p in profiles.split(",") if p.strip()),
    )


def _settings(args: argparse.Namespace, node_name: str) -> service.Settings:
    xids = frozenset(int(x) for x in args.ignore_xids.split(",") if x.strip())
    return service.Settings(
        node_name=node_name,
        register=args.register,
        registration=discover.RegistrationConfig(
            split_count=args.split_count,
            memory_scaling=args.memory_scaling,
            core_scaling=args.core_scaling,
            mig_allowlist=tuple(parse_mig_allowlist(spec) for spec in args.mig_profiles),
        ),
        refresh_s=args.refresh,
        telemetry_s=args.telemetry_interval,
        quiet_period_s=args.health_quiet_period,
        ignored_xids=xids,
        watch_health=not args.once,
    )


def main(args: argparse.Namespace) -> int:
    """Run the agent; returns the exit status."""
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    node_name = args.node_name or (socket.gethostname() if args.dry_run else None)
    if not node_name:
        print("gpuslice agent: set --node-name or NODE_NAME", file=sys.stderr)
        return 2
    try:
        settings = _settings(args, node_name)
        factory = open_backend(args.backend)
    except (ValueError, KeyError) as e:
        print(f"gpuslice agent: {e}", file=sys.stderr)
        return 2
    api = None
    if not args.dry_run:
        try:
            api = nodes.NodeClient.from_kubeconfig(args.kubeconfig, node_name, time.time)
        except Exception as e:  # kubeconfig problems come as several exception types
            print(f"gpuslice agent: cannot configure the API client: {e}", file=sys.stderr)
            return 2
    agent = service.Agent(settings, factory, api, metrics.AgentMetrics())
    if args.once:
        return _once(agent)
    return _serve(agent, args.listen)


def _once(agent: service.Agent) -> int:
    try:
        report = agent.refresh()
        wanted, patched = agent.publish_telemetry()
        report.annotations.update(wanted)
        report.patched = sorted({*report.patched, *patched})
        report.yielded = agent.yielded
    finally:
        agent.close()
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(report), indent=2).decode() + "\n")
    return 0 if report.error is None else 1


def _serve(agent: service.Agent, listen: str) -> int:
    stop = threading.Event()

    def on_stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()
        agent.wake()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, lambda _s, _f: agent.request_refresh())
    http = None
    if listen:
        try:
            http = server.AgentServer(
                server.parse_listen(listen),
                agent.metrics.render,
                agent.request_refresh,
                lambda: _health(agent),
            )
        except (OSError, ValueError) as e:
            print(f"gpuslice agent: cannot listen on {listen}: {e}", file=sys.stderr)
            return 2
        http.start()
        log.info("serving /metrics, /healthz and POST /refresh on %s", listen)
    try:
        agent.run(stop)
    finally:
        if http is not None:
            http.stop()
        agent.close()
    return 0


def _health(agent: service.Agent) -> tuple[bool, str]:
    """Always healthy (the liveness probe must not restart the agent for what it only reports)."""
    report = agent.last_report
    watcher = agent.watcher
    parts = [f"node {report.node}", f"backend {report.backend or 'unavailable'}"]
    if report.error:
        parts.append(report.error)
    if watcher is not None and watcher.error:
        parts.append(watcher.error)
    refused = agent.registration_refused
    if refused is not None:
        parts.append(refused)
    others = {k: v for k, v in agent.yielded.items() if refused is None or k != keys.NODE_REGISTER}
    if others:
        owned = ", ".join(f"{k} ({', '.join(v)})" for k, v in others.items())
        parts.append(f"left to other writers: {owned}")
    return True, "; ".join(parts)
