"""``gpuslice serve``'s listeners: mTLS on the main one, the plain metrics one, one SIGTERM for both.

Real uvicorn servers on loopback ports run ``serve.serve_all`` in this (the main) thread, where
signal handlers can be installed; clients run in worker threads so the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import ssl
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
from starlette.testclient import TestClient

from gpuslice.extender import config, serve
from gpuslice.extender.http import app as apps
from tests import pki
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Lifespan:
    """A background service that counts how often the lifespan entered and left it."""

    def __init__(self, fail: bool = False) -> None:
        self.entered = 0
        self.exited = 0
        self.fail = fail

    @contextlib.asynccontextmanager
    async def __call__(self) -> AsyncIterator[object]:
        if self.fail:
            raise RuntimeError("service failed to start")
        self.entered += 1
        try:
            yield self
        finally:
            self.exited += 1


def _deps(service: Lifespan, synced: Callable[[], bool] = lambda: True) -> apps.Deps:
    deps = fakes.make_deps(fakes.cluster_cache(node("n").gpus(1)), synced=synced)
    return dataclasses.replace(deps, services=[service])


def _servers(
    settings: config.Settings, deps: apps.Deps, metrics: bool = True
) -> tuple[serve.QuietServer, serve.QuietServer | None]:
    main = serve.QuietServer(
        serve.listener_config(settings, apps.create_app(deps), settings.host, settings.port, main=True)
    )
    if not metrics:
        return main, None
    side_config = serve.listener_config(
        settings, apps.create_metrics_app(deps), settings.metrics_host, settings.metrics_port, main=False
    )
    return main, serve.QuietServer(side_config)


def _run(
    main: serve.QuietServer,
    side: serve.QuietServer | None,
    while_serving: Callable[[], Awaitable[None]] | None = None,
    before_exit: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """``serve_all``; once both listen, run ``while_serving`` and send this process SIGTERM."""

    async def scenario() -> int:
        task = asyncio.create_task(serve.serve_all(main, side, before_exit))
        while not (main.started and (side is None or side.started)) and not task.done():
            await asyncio.sleep(0.02)
        if not task.done():
            if while_serving is not None:
                await while_serving()
            os.kill(os.getpid(), signal.SIGTERM)
        return await task

    with asyncio.Runner(loop_factory=main.config.get_loop_factory()) as runner:
        return runner.run(scenario())


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def _get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5, context=context) as resp:  # noqa: S310 - loopback
        return int(resp.status), resp.read().decode()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    return pki.make(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def ports() -> tuple[int, int]:
    return _free_port(), _free_port()


def _settings(ports: tuple[int, int], certs: pki.Pki | None = None) -> config.Settings:
    values = {"listen": f"127.0.0.1:{ports[0]}", "metrics_listen": f"127.0.0.1:{ports[1]}"}
    if certs is not None:
        values |= {
            "tls_cert": str(certs.server_cert),
            "tls_key": str(certs.server_key),
            "tls_client_ca": str(certs.ca),
        }
    return config.validate(values)


# ----------------------------------------------------------------------------- the metrics app


def test_metrics_app_answers_like_the_main_app() -> None:
    synced = [False]
    deps = _deps(Lifespan(), synced=lambda: synced[0])
    with TestClient(apps.create_app(deps)) as main, TestClient(apps.create_metrics_app(deps)) as side:
        for path in ("/healthz", "/readyz"):
            a, b = main.get(path), side.get(path)
            assert (a.status_code, a.text) == (b.status_code, b.text)
        assert (side.get("/readyz").status_code, side.get("/readyz").text) == (503, "cache not synced")
        synced[0] = True
        assert (side.get("/readyz").status_code, side.get("/readyz").text) == (200, "ok")
        metrics = side.get("/metrics")
        assert metrics.headers["content-type"] == main.get("/metrics").headers["content-type"]
        assert "gpuslice_cache_synced 1.0" in metrics.text  # the /readyz above set the shared gauge
        # The verbs are not served there.
        assert side.post("/filter", content=b"{}").status_code == 404
        assert side.get("/filter").status_code == 404


def test_metrics_app_has_no_lifespan() -> None:
    service = Lifespan()
    with TestClient(apps.create_metrics_app(_deps(service))) as side:
        assert side.get("/healthz").text == "ok"
    assert service.entered == 0


# ----------------------------------------------------------------------------- both listeners


def test_mtls_listener_and_plain_metrics_listener_stop_together_on_sigterm(
    certs: pki.Pki, ports: tuple[int, int]
) -> None:
    settings = _settings(ports, certs)
    service = Lifespan()
    main, side = _servers(settings, _deps(service))
    seen: dict[str, object] = {}

    async def while_serving() -> None:
        seen["readyz"] = await asyncio.to_thread(_get, f"http://127.0.0.1:{ports[1]}/readyz")
        seen["metrics"] = await asyncio.to_thread(_get, f"http://127.0.0.1:{ports[1]}/metrics")
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            seen[f"with-cert {version.name}"] = await asyncio.to_thread(
                pki.tls_get, ports[0], certs.ca, (certs.client_cert, certs.client_key), version=version
            )
        for name, client in (("no-cert", None), ("stranger", (certs.stranger_cert, certs.stranger_key))):
            try:
                await asyncio.to_thread(
                    pki.tls_get, ports[0], certs.ca, client, version=ssl.TLSVersion.TLSv1_2
                )
            except ssl.SSLError as err:
                seen[f"{name} TLSv1_2"] = err
            seen[f"{name} TLSv1_3"] = await asyncio.to_thread(pki.tls_get, ports[0], certs.ca, client)
        # The metrics listener speaks plain HTTP only, the main one TLS only.
        try:
            await asyncio.to_thread(_get, f"http://127.0.0.1:{ports[0]}/metrics")
        except OSError as err:
            seen["plain-on-main"] = err

    assert _run(main, side, while_serving) == 0
    metrics = seen["metrics"]
    assert isinstance(metrics, tuple) and metrics[0] == 200
    assert "gpuslice_cache_synced 1.0" in metrics[1]  # set by the /readyz just before
    assert seen["readyz"] == (200, "ok")
    for version in ("TLSv1_2", "TLSv1_3"):
        answer = seen[f"with-cert {version}"]
        assert isinstance(answer, bytes) and answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok")
    for name in ("no-cert", "stranger"):
        # TLS 1.2: the server ends the handshake. TLS 1.3: the client's side of the handshake is
        # done before the server checks its certificate; the server closes without an answer.
        assert isinstance(seen[f"{name} TLSv1_2"], ssl.SSLError)
        assert seen[f"{name} TLSv1_3"] == b""
    assert "plain-on-main" in seen
    # Both stopped, the services entered once (main listener's lifespan only) and left.
    assert _refused(ports[0]) and _refused(ports[1])
    assert (service.entered, service.exited) == (1, 1)


def test_sigterm_without_a_metrics_listener(ports: tuple[int, int]) -> None:
    settings = config.validate({"listen": f"127.0.0.1:{ports[0]}"})
    service = Lifespan()
    main, side = _servers(settings, _deps(service), metrics=False)
    got: list[tuple[int, str]] = []

    async def while_serving() -> None:
        got.append(await asyncio.to_thread(_get, f"http://127.0.0.1:{ports[0]}/healthz"))

    assert _run(main, side, while_serving) == 0
    assert got == [(200, "ok")] and _refused(ports[0]) and (service.entered, service.exited) == (1, 1)


def test_sigterm_runs_before_exit_while_both_listeners_still_answer(ports: tuple[int, int]) -> None:
    service = Lifespan()
    main, side = _servers(_settings(ports), _deps(service))
    seen: list[object] = []

    async def before_exit() -> None:  # the leader's label removal runs here in `gpuslice serve`
        seen.append(await asyncio.to_thread(_get, f"http://127.0.0.1:{ports[0]}/healthz"))
        seen.append(await asyncio.to_thread(_get, f"http://127.0.0.1:{ports[1]}/readyz"))
        seen.append(service.exited)

    assert _run(main, side, before_exit=before_exit) == 0
    assert seen == [(200, "ok"), (200, "ok"), 0]
    assert _refused(ports[0]) and _refused(ports[1]) and (service.entered, service.exited) == (1, 1)


@pytest.mark.parametrize("trouble", ["hangs", "raises"])
def test_a_failing_before_exit_does_not_keep_the_servers_up(
    ports: tuple[int, int], trouble: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serve, "BEFORE_EXIT_S", 0.3)
    service = Lifespan()
    main, side = _servers(_settings(ports), _deps(service))
    calls: list[str] = []

    async def before_exit() -> None:
        calls.append(trouble)
        if trouble == "hangs":
            await asyncio.sleep(3600)
        raise RuntimeError("apiserver away")

    assert _run(main, side, before_exit=before_exit) == 0
    assert calls == [trouble]
    assert _refused(ports[0]) and _refused(ports[1]) and (service.entered, service.exited) == (1, 1)


@contextlib.contextmanager
def _occupied(port: int) -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield


def test_metrics_port_in_use_fails_before_any_service_starts(ports: tuple[int, int]) -> None:
    service = Lifespan()
    main, side = _servers(_settings(ports), _deps(service))
    with _occupied(ports[1]):
        assert _run(main, side) == 1
    assert not main.started and service.entered == 0 and _refused(ports[0])


def test_main_port_in_use_stops_the_metrics_listener(ports: tuple[int, int]) -> None:
    service = Lifespan()
    main, side = _servers(_settings(ports), _deps(service))
    with _occupied(ports[0]):
        assert _run(main, side) == 1
    assert side is not None and side.started and _refused(ports[1])
    assert service.entered == service.exited  # uvicorn ran the lifespan down again


def test_lifespan_failure_stops_the_metrics_listener(ports: tuple[int, int]) -> None:
    main, side = _servers(_settings(ports), _deps(Lifespan(fail=True)))
    assert _run(main, side) == 1
    assert side is not None and side.started and _refused(ports[1]) and _refused(ports[0])


def test_main_listener_requires_client_certificates(certs: pki.Pki, ports: tuple[int, int]) -> None:
    main_config = serve.listener_config(
        _settings(ports, certs), apps.create_app(_deps(Lifespan())), "127.0.0.1", ports[0], main=True
    )
    main_config.load()
    assert main_config.ssl is not None and main_config.ssl.verify_mode == ssl.CERT_REQUIRED
    side_config = serve.listener_config(
        _settings(ports, certs), apps.create_metrics_app(_deps(Lifespan())), "127.0.0.1", ports[1], main=False
    )
    side_config.load()
    assert side_config.ssl is None and side_config.lifespan == "off"


# ----------------------------------------------------------------------------- shutdown drains the binds


def _post(url: str, body: dict[str, str]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(  # noqa: S310 - loopback
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:  # noqa: S310 - loopback
        return int(resp.status), json.loads(resp.read())


def test_sigterm_labels_a_pod_bound_just_before_while_the_services_still_run(ports: tuple[int, int]) -> None:
    """A pod's ``hami.io/vgpu-node`` label waits for its device plugin's Allocate (``bind``'s
    ``_label_later``, at most ``LABEL_AFTER_S``); a shutdown in between labels it
    (``BindFlow.drain``) before the services, the API client among them, stop."""
    binder = fakes.FakeBinder(pods={"default/p": fakes.gpu_pod("p")})
    labels_at_exit: list[dict[str, str]] = []

    @contextlib.asynccontextmanager
    async def api_client() -> AsyncIterator[object]:
        yield binder
        labels_at_exit.append(dict(binder.labels))

    deps = fakes.make_deps(fakes.cluster_cache(node("n").gpus(1)), binder)
    deps = dataclasses.replace(deps, services=[api_client])
    main, side = _servers(config.validate({"listen": f"127.0.0.1:{ports[0]}"}), deps, metrics=False)
    seen: list[object] = []

    async def while_serving() -> None:
        args = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n"}
        seen.append(await asyncio.to_thread(_post, f"http://127.0.0.1:{ports[0]}/bind", args))
        seen.append(dict(binder.labels))  # bound; the lock still names the pod: no label yet

    assert _run(main, side, while_serving) == 0
    assert seen == [(200, {"Error": ""}), {}]
    assert labels_at_exit == [{"default/p": "n"}]


def test_a_drain_that_hangs_does_not_keep_the_server_up(
    ports: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(apps, "DRAIN_BINDS_S", 0.3)
    service = Lifespan()
    deps = _deps(service)
    started: list[bool] = []

    async def hangs() -> None:
        started.append(True)
        await asyncio.sleep(3600)

    monkeypatch.setattr(deps.flow, "drain", hangs)
    main, side = _servers(config.validate({"listen": f"127.0.0.1:{ports[0]}"}), deps, metrics=False)
    assert _run(main, side) == 0
    assert started == [True]
    assert _refused(ports[0]) and (service.entered, service.exited) == (1, 1)
