"""A tiny scripted HTTP/1.1 server on 127.0.0.1 standing in for kube-apiserver.

Each request is answered by ``handler(request) -> Reply``; a ``Reply`` with ``lines`` streams them
(a watch) and then closes the connection. Every connection is closed after one answer. Every
request is recorded in ``requests`` so tests can prove what was (not) sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from lightkube.config.kubeconfig import KubeConfig
from lightkube.config.models import Cluster, User

from gpuslice.kube import client as kclient

_REASONS = {
    200: "OK",
    201: "Created",
    404: "Not Found",
    409: "Conflict",
    410: "Gone",
    429: "Too Many Requests",
}


@dataclasses.dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclasses.dataclass
class Reply:
    status: int = 200
    body: Any = None
    lines: list[Any] | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    close_early: bool = False
    """Drop the connection without any answer (a transport failure)."""
    hang_s: float = 0.0
    """After the lines, keep the connection open and silent this long (a frozen apiserver)."""


def status_body(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def error(code: int, reason: str, message: str = "") -> Reply:
    return Reply(code, status_body(code, reason, message))


Handler = Callable[[Request], Reply]


class FakeApi:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self._server: asyncio.Server | None = None
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            url = urlsplit(target)
            req = Request(method, url.path, dict(parse_qsl(url.query)), body)
            self.requests.append(req)
            reply = self.handler(req)
            if reply.close_early:
                return
            out_headers = {"Content-Type": "application/json", "Connection": "close", **reply.headers}
            if reply.lines is None:
                payload = b"" if reply.body is None else json.dumps(reply.body).encode()
                out_headers["Content-Length"] = str(len(payload))
            status_line = f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}\r\n"
            writer.write(
                (status_line + "".join(f"{k}: {v}\r\n" for k, v in out_headers.items()) + "\r\n").encode()
            )
            if reply.lines is None:
                writer.write(payload)
            else:
                for line in reply.lines:
                    writer.write(json.dumps(line).encode() + b"\n")
            await writer.drain()
            if reply.hang_s:
                await asyncio.sleep(reply.hang_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def paths(self, method: str | None = None) -> list[str]:
        return [r.path for r in self.requests if method is None or r.method == method]


@contextlib.asynccontextmanager
async def serving(handler: Handler, **client_args: Any) -> AsyncIterator[tuple[FakeApi, kclient.KubeClient]]:
    """A started fake server and a ``KubeClient`` pointing at it (no rate limit unless given)."""
    api = FakeApi(handler)
    url = await api.start()
    config = KubeConfig.from_one(cluster=Cluster(server=url), user=User(token="t")).get()
    assert config is not None
    client_args.setdefault("qps", 0)
    kube = kclient.KubeClient(config, **client_args)
    try:
        yield api, kube
    finally:
        await kube.aclose()
        await api.stop()


def node(name: str, rv: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "resourceVersion": rv, "annotations": annotations or {}},
    }


def node_list(items: list[dict[str, Any]], rv: str, cont: str = "") -> dict[str, Any]:
    meta = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {"kind": "NodeList", "metadata": meta, "items": items}
