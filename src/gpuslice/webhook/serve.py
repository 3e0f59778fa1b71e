"""``gpuslice webhook``: the admission webhook server (mutating ``/webhook``, validating ``/validate``).

Reads the settings once (flags > ``GPUSLICE_WEBHOOK_*`` environment > defaults; an invalid
setting prints one line and exits with status 2), connects to the apiserver (``--kubeconfig``,
else in-cluster, ``$KUBECONFIG`` or ``~/.kube/config``) to watch nodes for the capacity check,
and serves the app with uvicorn, over HTTPS when ``--tls-cert`` and ``--tls-key`` are given (the
apiserver calls webhooks over HTTPS only; the files are read again every few seconds and reloaded
when they change, ``kube.tlsfiles``). RBAC: nodes get/list/watch.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import AsyncIterator

import uvicorn

from gpuslice.kube import client as kclient
from gpuslice.kube import tlsfiles
from gpuslice.webhook import app as apps
from gpuslice.webhook import capacity, config, metrics, mutate, validate

LOGGER_NAME = "gpuslice.webhook"
KEEP_ALIVE_S = 30
"""Idle keep-alive connections are closed after this (the apiserver reuses its connections)."""
MAX_CONNECTIONS = 1000
"""Concurrent connections served; more get 503."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuslice webhook`` flags (see ``webhook.config``)."""
    config.add_arguments(parser)


def configure_logging(verbosity: int) -> logging.Logger:
    """One stderr handler for the webhook's logger (and the informer's warnings)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(name)s] %(message)s"))
    root = logging.getLogger("gpuslice")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
    return logging.getLogger(LOGGER_NAME)


def build(settings: config.Settings, log: logging.Logger) -> apps.Deps:
    """Wire the real dependencies (no I/O happens until the app's lifespan starts)."""
    kube = kclient.KubeClient.auto(settings.kubeconfig or None)
    nodes = capacity.NodeCapacity(kube)

    @contextlib.asynccontextmanager
    async def kube_client() -> AsyncIterator[object]:
        try:
            yield kube
        finally:
            await kube.aclose()

    return apps.Deps(
        mutate_options=mutate.Options(
            scheduler_name=settings.scheduler_name, request_config=settings.request_config
        ),
        validate_options=validate.Options(
            deny_privileged=settings.deny_privileged, request_config=settings.request_config
        ),
        metrics=metrics.Metrics(),
        log=log,
        verbosity=settings.verbosity,
        max_cards=nodes.max_cards,
        ready=nodes.ready,
        services=[kube_client, nodes.running],
    )


def main(args: argparse.Namespace) -> int:
    """Run the webhook until SIGINT/SIGTERM; 2 on invalid settings, 1 on startup failure."""
    try:
        settings = config.load(args)
    except config.ConfigError as err:
        print(f"gpuslice webhook: {err}", file=sys.stderr)
        return 2
    log = configure_logging(settings.verbosity)
    try:
        deps = build(settings, log)
    except Exception as err:  # noqa: BLE001 - startup problems (kubeconfig, credentials) end the command
        print(f"gpuslice webhook: cannot start: {err}", file=sys.stderr)
        return 1
    log.info(
        "serving listen=%s tls=%s scheduler_name=%s deny_privileged=%s resources=%s",
        settings.listen,
        bool(settings.tls_cert),
        settings.scheduler_name,
        settings.deny_privileged,
        ",".join(settings.resource_names.all()),
    )
    server_config = listener_config(settings, deps)
    try:
        server_config.load()  # TLS files are read here: a bad certificate ends the command now
    except Exception as err:  # noqa: BLE001 - startup problems end the command
        print(f"gpuslice webhook: cannot start: {err}", file=sys.stderr)
        return 1
    reloader = certificate_reloader(settings, server_config, deps.metrics)
    if reloader is not None:  # the lifespan reads deps.services when it starts, after this
        deps.services = [*deps.services, reloader.running]
    server = uvicorn.Server(server_config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else 1


def listener_config(settings: config.Settings, deps: apps.Deps) -> uvicorn.Config:
    """The listener's uvicorn configuration (HTTPS when ``tls_cert`` is set)."""
    return uvicorn.Config(
        apps.create_app(deps),
        host=settings.host,
        port=settings.port,
        ssl_certfile=settings.tls_cert or None,
        ssl_keyfile=settings.tls_key or None,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=MAX_CONNECTIONS,
    )


def certificate_reloader(
    settings: config.Settings,
    server_config: uvicorn.Config,
    m: metrics.Metrics,
    period_s: float = tlsfiles.PERIOD_S,
) -> tlsfiles.Reloader | None:
    """The serving certificate's reloader, its files loaded once (None without TLS).

    Call it after ``server_config.load()``: it reloads into the SSL context uvicorn built there
    (``kube.tlsfiles``), and runs as a lifespan service (``Reloader.running``).
    """
    files = tlsfiles.Files(settings.tls_cert, settings.tls_key) if settings.tls_cert else None
    return tlsfiles.start_reloader(server_config.ssl, files, m.tls, period_s=period_s)
