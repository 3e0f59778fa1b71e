"""``gpuslice serve``: the HTTP extender a kube-scheduler calls.

Reads the settings once (flags > ``GPUSLICE_*`` environment > ``--config`` YAML > defaults; an
invalid setting prints one clear line and exits with status 2), connects to the apiserver
(``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config`` or in-cluster), builds the cache, the
informer feed, the event recorder and the bind path, and serves the app with uvicorn.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from collections.abc import AsyncIterator

import uvicorn

from gpuslice.cache import cache as caches
from gpuslice.extender import app as apps
from gpuslice.extender import bind as binds
from gpuslice.extender import binder as binders
from gpuslice.extender import config, failpoints, feed, leader, logs, metrics, recovery, scheduling, view
from gpuslice.extender import httpserver as httpservers
from gpuslice.kube import client as kclient
from gpuslice.kube import events as kevents
from gpuslice.kube import lease


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


def build(settings: config.Settings, log: logs.Log) -> apps.Deps:
    """Wire the real dependencies (no I/O happens until the app's lifespan starts)."""
    kube = kclient.KubeClient.auto(settings.kubeconfig or None, qps=settings.qps, burst=settings.burst)
    cache = caches.ClusterCache()
    m = metrics.Metrics(lambda: view.states(cache.snapshot()))
    policies = scheduling.Policies.build(settings.node_policy, settings.card_policy)
    instance = f"{socket.gethostname()}-{os.getpid()}"[:128]
    recorder = kevents.Recorder(kube, instance=instance) if settings.events else None
    events: binds.Events = recorder if recorder is not None else binds.NoEvents()
    source = feed.Feed(kube, cache, settings, log, m, recorder)
    lead = leadership(settings, kube)
    flow = binds.BindFlow(
        cache=cache,
        binder=binders.KubeBinder(kube, settings.node_lock_expiry_s, cached_node=source.node),
        policies=policies,
        request_config=settings.request_config,
        clock=time.time,
        log=log,
        metrics=m,
        events=events,
        truth=source,
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
    )
    source.on_node_lock = flow.node_lock_changed
    source.on_capacity_freed = flow.capacity_freed
    limits = recovery.Limits(
        settings.orphan_grace_s, settings.allocate_timeout_s, settings.node_lock_expiry_s
    )
    sweeper = recovery.Recovery(
        kube, source, flow, limits, events, m, log, lead.is_leading, settings.recovery_period_s
    )

    def changed(leading: bool) -> None:
        m.leader.set(1 if leading else 0)
        if leading:
            sweeper.wake()  # a new leader clears what its predecessor left at once

    lead.on_change = changed
    m.leader.set(1 if lead.leading else 0)

    def ready() -> bool:
        return not lead.reports_not_ready_as_follower or lead.leading

    @contextlib.asynccontextmanager
    async def kube_client() -> AsyncIterator[object]:
        try:
            yield kube
        finally:
            await kube.aclose()

    services: list[apps.Service] = [kube_client, source.running, lead.running, sweeper.running]
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
        policies=policies,
        log=log,
        metrics=m,
        events=events,
        ready=ready,
        synced=source.ready,
        services=services,
        invalid_nodes=source.invalid_nodes,
        excluded=source.health.excluded,
    )


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
    log.info(
        "serving",
        leader_elect=settings.leader_elect,
        listen=settings.listen,
        node_policy=settings.node_policy,
        card_policy=settings.card_policy,
        tls=bool(settings.tls_cert),
    )
    uvicorn.run(
        apps.create_app(deps),
        host=settings.host,
        port=settings.port,
        ssl_certfile=settings.tls_cert or None,
        ssl_keyfile=settings.tls_key or None,
        log_level="warning",
        access_log=False,
        lifespan="on",
        loop="uvloop",  # both pinned in requirements.lock; explicit so a missing one fails loudly
        # httptools with header and body deadlines: uvicorn has neither (see extender.httpserver).
        http=httpservers.protocol_class(settings.header_timeout_s, settings.body_timeout_s),
        timeout_keep_alive=max(1, round(settings.idle_timeout_s)),  # uvicorn takes whole seconds
        limit_concurrency=settings.max_connections,  # connections beyond it are answered 503
    )
    return 0
