"""``gpuslice serve``: the HTTP extender a kube-scheduler calls.

Reads the settings once (flags > ``GPUSLICE_*`` environment > ``--config`` YAML > defaults; an
invalid setting prints one clear line and exits with status 2), connects to the apiserver
(``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config`` or in-cluster), builds the cache, the
informer feed, the event recorder and the bind path, and serves the app with uvicorn.

With ``--tls-client-ca`` the HTTPS listener requires a client certificate signed by that CA
(``ssl.CERT_REQUIRED``; a client without one fails the handshake). The certificate, key and CA
files are read again every few seconds and reloaded when they change (``kube.tlsfiles``).
With ``--metrics-listen`` a second, plain-HTTP listener serves ``/metrics``, ``/healthz`` and
``/readyz`` (kubelet probes and Prometheus present no client certificate). Both are
``uvicorn.Server``s in one event loop; the lifespan (informers, leader election, recovery, events)
runs on the main one only. The metrics listener starts first, so a port conflict ends the command
before any service starts; one SIGTERM/SIGINT handler stops both (a second SIGINT forces the
exit), and if either server fails the other is stopped and the command exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import uvicorn
from starlette.types import ASGIApp

from gpuslice.cache import cache as caches
from gpuslice.cache import shapes
from gpuslice.extender import config, feed, gangfeed, metrics, recovery
from gpuslice.extender import preemption as preemptions
from gpuslice.extender.binding import barrier as barriers
from gpuslice.extender.binding import bind as binds
from gpuslice.extender.binding import binder as binders
from gpuslice.extender.binding import failpoints, leader, leaderlabel, lockview
from gpuslice.extender.http import app as apps
from gpuslice.extender.http import httpserver as httpservers
from gpuslice.extender.ops import shadow as shadows
from gpuslice.framework import gangs as gang_plans
from gpuslice.framework import logs, nominations, view
from gpuslice.framework import pending as pendings
from gpuslice.framework import profile as profiles
from gpuslice.kube import client as kclient
from gpuslice.kube import events as kevents
from gpuslice.kube import lease, liveview, objects, tlsfiles

BEFORE_EXIT_S = 5.0
"""Longest wait on SIGTERM before the listeners close (the leader's pod label removal)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuslice serve`` flags (one per setting, see ``extender.config``)."""
    config.add_arguments(parser)


def leadership(settings: config.Settings, kube: kclient.KubeClient) -> leader.Leadership:
    """The leader election the settings ask for (see ``extender.leader``)."""
    identity = settings.leader_identity or socket.gethostname()
    if settings.leader_elect == "lease":
        elector = lease.Elector(
            kube,
            settings.lease_namespace,
            settings.lease_name,
            identity,
            lease_duration_s=settings.lease_duration_s,
            renew_deadline_s=settings.renew_deadline_s,
            retry_period_s=settings.retry_period_s,
        )
        return leader.OwnLease(elector)
    if settings.leader_elect == "scheduler":
        return leader.SchedulerLease(
            kube, settings.lease_namespace, settings.lease_name, identity, settings.retry_period_s
        )
    return leader.Leadership()


def pod_label(
    settings: config.Settings, kube: kclient.KubeClient, log: logs.Log
) -> leaderlabel.PodLabel | None:
    """The leader's pod label writer: in ``lease`` mode with ``pod_name`` and ``pod_namespace``."""
    if settings.leader_elect != "lease":
        return None
    if not (settings.pod_name and settings.pod_namespace):
        log.warning(
            "no leader pod label: it needs --pod-name and --pod-namespace (or POD_NAME and "
            "POD_NAMESPACE); followers report not-ready instead, so a rollout with maxUnavailable 0 "
            "cannot finish and a PodDisruptionBudget blocks drains",
            pod_name=settings.pod_name,
            pod_namespace=settings.pod_namespace,
        )
        return None
    write = leaderlabel.pod_writer(kube, settings.pod_namespace, settings.pod_name)
    pod = f"{settings.pod_namespace}/{settings.pod_name}"
    return leaderlabel.PodLabel(write, pod, retry_s=settings.retry_period_s)


def build(settings: config.Settings, log: logs.Log) -> apps.Deps:
    """Wire the real dependencies (no I/O happens until the app's lifespan starts)."""
    kube = kclient.KubeClient.auto(settings.kubeconfig or None, qps=settings.qps, burst=settings.burst)
    # Cards held for pods not placed yet, which the cache applies: preemptors' nominations and
    # gang plans, two holders on one journal (framework.nominations.Merged).
    journal = nominations.Journal()
    nominator = nominations.Nominator(journal)
    gang_holds = nominations.Nominator(journal)
    cache = caches.ClusterCache(
        shapes.ShapeHistogram(settings.workload), nominator=nominations.Merged(journal, nominator, gang_holds)
    )
    m = metrics.Metrics(lambda: view.states(cache.snapshot()))
    profile = profiles.Profile.from_settings(settings, clock=time.time)
    directory = gang_plans.Directory()
    plans = (
        gang_plans.Gangs(profile, directory, gang_holds, settings.gang_plan_ttl_s) if settings.gangs else None
    )
    barrier = (
        None if plans is None else barriers.Barrier(plans, time.time, time.monotonic, settings.gang_wait_s)
    )
    instance = f"{socket.gethostname()}-{os.getpid()}"[:128]
    recorder = kevents.Recorder(kube, instance=instance) if settings.events else None
    events: binds.Events = recorder if recorder is not None else binds.NoEvents()
    source = feed.Feed(kube, cache, settings, log, m, recorder)
    lead = leadership(settings, kube)
    flow = binds.BindFlow(
        cache=cache,
        binder=binders.KubeBinder(
            kube, settings.node_lock_expiry_s, cached_node=source.node, label_pods=settings.label_pods
        ),
        profile=profile,
        request_config=settings.request_config,
        clock=time.time,
        log=log,
        metrics=m,
        events=events,
        truth=source,
        foreign_claims=source,
        leading=lead.is_leading,
        synced=source.ready,
        excluded=source.health.excluded,
        invalid_nodes=source.invalid_nodes,
        lock_owner=source.lock_owner,
        lock_wait_s=settings.lock_wait_s,
        bind_timeout_s=settings.bind_timeout_s,
        commit_deadline_s=settings.commit_deadline_s,
        sync_wait_s=settings.sync_wait_s,
        faults=failpoints.Failpoints.from_env(),
        barrier=barrier,
    )
    locks = lockview.LockView(  # what the lock margin reads (docs/node-choice.md)
        source.health.lock_values, source.pod, flow.in_flight, time.time, settings.node_lock_expiry_s
    )
    shadow = shadows.build(settings, profile, m, cache)  # None unless --shadow-policy
    limits = recovery.Limits(
        settings.orphan_grace_s, settings.allocate_timeout_s, settings.node_lock_expiry_s
    )
    sweeper = recovery.Recovery(
        kube, source, flow, limits, events, m, log, lead.is_leading, settings.recovery_period_s
    )
    preempting = None  # GPU-aware preemption (docs/preemption.md), on unless --preemption false
    if settings.preemption:
        preempting = preemptions.Preemption(
            kube,
            cache,
            profile,
            events,
            m,
            log,
            source.pod,
            leading=lead.is_leading,
            nominator=nominator,
            ttl_s=settings.nomination_ttl_s,
        )

    label = pod_label(settings, kube, log)  # the Service's way to the leader (lease mode)

    # Who hears which event: every listener is registered here, in the order it is told.
    source.on_node_lock.add(flow.node_lock_changed)  # binds waiting for HAMi's lock; labels
    source.on_capacity_freed.add(flow.capacity_freed)  # requeue nudges
    if shadow is not None:
        flow.on_bound.add(shadow.bound)
        source.on_capacity_freed.add(shadow.capacity_freed)  # departures
    lead.on_change.add(lambda leading: m.leader.set(1 if leading else 0))
    if label is not None:
        lead.on_change.add(label.want)
    lead.on_change.add(_wake_when_leading(sweeper))
    m.leader.set(1 if lead.leading else 0)

    def follower() -> bool:
        return lead.calls_go_to_leader and not lead.leading

    @contextlib.asynccontextmanager
    async def kube_client() -> AsyncIterator[object]:
        try:
            yield kube
        finally:
            await kube.aclose()

    services: list[apps.Service] = [kube_client, source.running]
    if label is not None:  # entered before the election, left after it: the last wish is "not leading"
        services.append(label.running)
    services += [lead.running, sweeper.running]
    if preempting is not None:
        services.append(preempting.running)
    if plans is not None and barrier is not None:
        members = gangfeed.GangFeed(kube, directory, plans, barrier, settings.request_config, log, m)
        source.on_pod.add(members.on_pod)
        services.append(members.running)
    if recorder is not None:

        @contextlib.asynccontextmanager
        async def event_worker() -> AsyncIterator[object]:
            async with recorder:
                yield recorder

        services.append(event_worker)
    return apps.Deps(
        settings=settings,
        cache=cache,
        flow=flow,
        profile=profile,
        log=log,
        metrics=m,
        events=events,
        follower=follower,
        follower_ready=label is not None,
        before_exit=label.drain if label is not None else None,
        synced=source.ready,
        services=services,
        invalid_nodes=source.invalid_nodes,
        excluded=source.health.excluded,
        shadow=shadow,
        preemption=preempting,
        nominator=nominator,
        gangs=plans,
        locks=locks.busy,
        pending=pendings.PendingPods(clock=time.time, alive=_pending_alive(source)),
        read_pod=_pod_reader(source, kube),
    )


def _wake_when_leading(sweeper: recovery.Recovery) -> Callable[[bool], None]:
    """A new leader runs a recovery pass at once: it clears what its predecessor left."""

    def changed(leading: bool) -> None:
        if leading:
            sweeper.wake()

    return changed


def _pending_alive(source: feed.Feed) -> Callable[[str, str], bool]:
    """A pending pod stays listed while the watch still shows it unbound, under the same uid."""

    def alive(key: str, uid: str) -> bool:
        pod = source.pod(key)
        return pod is not None and pod.metadata.uid == uid and not pod.spec.node_name and not pod.terminated

    return alive


def _pod_reader(
    source: feed.Feed, kube: kclient.KubeClient
) -> Callable[[str, str], Awaitable[objects.Pod | None]]:
    """``/explain``'s pod lookup: the watched pod, else one GET (None: no such pod)."""

    async def read(namespace: str, name: str) -> objects.Pod | None:
        return source.pod(f"{namespace}/{name}") or await liveview.read_pod(kube, namespace, name)

    return read


def main(args: argparse.Namespace) -> int:
    """Run the extender until SIGINT/SIGTERM; 2 on invalid settings, 1 on startup failure."""
    try:
        settings = config.load(args)
    except config.ConfigError as err:
        print(f"gpuslice serve: {err}", file=sys.stderr)
        return 2
    log = logs.configure(settings.verbosity)
    try:
        deps = build(settings, log)
    except failpoints.FailpointError as err:
        print(f"gpuslice serve: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - startup problems (kubeconfig, TLS files) end the command
        print(f"gpuslice serve: cannot start: {err}", file=sys.stderr)
        return 1
    main_config = listener_config(settings, apps.create_app(deps), settings.host, settings.port, main=True)
    configs = [main_config]
    if settings.metrics_listen:
        metrics_app = apps.create_metrics_app(deps)
        configs.append(
            listener_config(settings, metrics_app, settings.metrics_host, settings.metrics_port, main=False)
        )
    try:
        for c in configs:
            c.load()  # TLS files are read here: a bad certificate or CA ends the command now
    except Exception as err:  # noqa: BLE001 - startup problems end the command
        print(f"gpuslice serve: cannot start: {err}", file=sys.stderr)
        return 1
    reloader = certificate_reloader(settings, main_config, deps.metrics)
    if reloader is not None:  # the lifespan reads deps.services when it starts, after this
        deps.services = [*deps.services, reloader.running]
    log.info(
        "serving",
        leader_elect=settings.leader_elect,
        listen=settings.listen,
        metrics_listen=settings.metrics_listen or None,
        node_policy=settings.node_policy,
        card_policy=settings.card_policy,
        resources=",".join(settings.resource_names.all()),
        tls=bool(settings.tls_cert),
        client_ca=bool(settings.tls_client_ca),
    )
    servers = [QuietServer(c) for c in configs]
    with asyncio.Runner(loop_factory=main_config.get_loop_factory()) as runner:
        code = runner.run(serve_all(servers[0], servers[1] if len(servers) > 1 else None, deps.before_exit))
    if code:
        print("gpuslice serve: a listener failed; see the log above", file=sys.stderr)
    return code


def listener_config(
    settings: config.Settings, app: ASGIApp, host: str, port: int, *, main: bool
) -> uvicorn.Config:
    """One listener's uvicorn configuration: TLS and the lifespan on the main listener only."""
    tls = main and bool(settings.tls_cert)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=settings.tls_cert if tls else None,
        ssl_keyfile=settings.tls_key if tls else None,
        ssl_ca_certs=settings.tls_client_ca if tls and settings.tls_client_ca else None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if tls and settings.tls_client_ca else ssl.CERT_NONE,
        lifespan="on" if main else "off",  # the services run once, under the main listener
        log_level="warning",
        access_log=False,
        loop="uvloop",  # both pinned in requirements.lock; explicit so a missing one fails loudly
        # httptools with header and body deadlines: uvicorn has neither (see extender.httpserver).
        http=httpservers.protocol_class(settings.header_timeout_s, settings.body_timeout_s),
        timeout_keep_alive=max(1, round(settings.idle_timeout_s)),  # uvicorn takes whole seconds
        limit_concurrency=settings.max_connections,  # connections beyond it are answered 503
    )


def certificate_reloader(
    settings: config.Settings,
    main_config: uvicorn.Config,
    m: metrics.Metrics,
    period_s: float = tlsfiles.PERIOD_S,
) -> tlsfiles.Reloader | None:
    """The main listener's certificate reloader, its files loaded once (None without TLS).

    Call it after ``main_config.load()``: it reloads into the SSL context uvicorn built there
    (``kube.tlsfiles``), and runs as a lifespan service (``Reloader.running``).
    """
    files = (
        tlsfiles.Files(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
        if settings.tls_cert
        else None
    )
    return tlsfiles.start_reloader(main_config.ssl, files, m.tls, period_s=period_s)


class QuietServer(uvicorn.Server):
    """A ``uvicorn.Server`` that leaves signals alone: ``serve_all`` installs one handler for all.

    uvicorn's own ``capture_signals`` (0.54) replaces the process handlers with ``signal.signal``
    for each server, so with two servers only the last one would hear SIGTERM.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """No per-server signal handling."""
        yield


async def _run(server: uvicorn.Server) -> int:
    """Serve until told to exit; 0, or 1 when uvicorn gave up (it ``sys.exit``s on startup failures)."""
    try:
        await server.serve()
    except SystemExit as exit_:  # uvicorn's startup failure (lifespan or bind): a code, not the process
        return 1 if exit_.code != 0 else 0
    return 0


async def serve_all(
    main_server: uvicorn.Server,
    metrics_server: uvicorn.Server | None,
    before_exit: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Run the main server (and the metrics server) until SIGTERM/SIGINT; the exit status.

    The metrics server is started first and must be listening before the main one (and with it
    the services) starts. When either ends on its own, the other is told to exit too. On the
    first signal ``before_exit`` runs (at most ``BEFORE_EXIT_S``) while both still serve, then
    they are told to exit; a second signal does not wait for it.
    """
    servers = [s for s in (metrics_server, main_server) if s is not None]
    loop = asyncio.get_running_loop()
    draining: list[asyncio.Task[None]] = []

    def stop(sig: signal.Signals) -> None:
        for server in servers:
            if server.should_exit and sig == signal.SIGINT:
                server.force_exit = True
            server.should_exit = True

    async def drain_then_stop(sig: signal.Signals) -> None:
        assert before_exit is not None
        try:
            await asyncio.wait_for(before_exit(), BEFORE_EXIT_S)
        except Exception as err:  # noqa: BLE001 - best effort: the exit goes on
            print(f"gpuslice serve: before exit: {err!r}", file=sys.stderr)
        if not any(server.should_exit for server in servers):  # a second signal has not stopped them
            stop(sig)

    def on_signal(sig: signal.Signals) -> None:
        if before_exit is None or draining:
            stop(sig)
            return
        draining.append(loop.create_task(drain_then_stop(sig), name="before-exit"))

    handled = (signal.SIGINT, signal.SIGTERM)
    for sig in handled:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        if metrics_server is None:
            return await _run(main_server)
        side = asyncio.create_task(_run(metrics_server), name="metrics-listener")
        while not metrics_server.started and not side.done():
            await asyncio.sleep(0.02)
        if side.done():
            return side.result() or 1
        if main_server.should_exit:  # stopped while the metrics listener started
            metrics_server.should_exit = True
            return await side

        def side_ended(_: asyncio.Task[int]) -> None:
            main_server.should_exit = True  # no metrics or probes: stop rather than run blind

        side.add_done_callback(side_ended)
        code = await _run(main_server)
        side_failed = side.done() and not metrics_server.should_exit  # ended without being told to
        metrics_server.should_exit = True
        side_code = await side
        return code or side_code or (1 if side_failed else 0)
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        for task in draining:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
