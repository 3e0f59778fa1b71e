"""Hostile HTTP input: deep JSON, oversized bodies and slow clients never get a 5xx or a held socket.

The app is built on the fake cache of ``fakes`` (no Kubernetes). The timeout tests run a real
uvicorn server with ``httpserver.protocol_class`` on a free loopback port, in a thread.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from gpuslice.codec import keys
from gpuslice.extender import config, wire
from gpuslice.extender.http import app as apps
from gpuslice.extender.http import httpserver, jsondepth
from gpuslice.model import status
from tests.unit.builders import node
from tests.unit.extender import fakes

pytestmark = pytest.mark.unit

VERBS = ("/filter", "/prioritize", "/score", "/bind", "/preempt")
LIMIT = 64  # Settings().max_json_depth
TOO_DEEP = f"JSON nested deeper than {LIMIT} levels"


def _deps(settings: config.Settings | None = None) -> apps.Deps:
    cache = fakes.cluster_cache(node("n-free").gpus(1), node("n-two").gpus(2))
    return fakes.make_deps(cache, settings=settings or config.Settings(events=False))


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(apps.create_app(_deps()), raise_server_exceptions=False) as c:
        yield c


def _valid(verb: str) -> dict[str, Any]:
    """A well-formed body for ``verb``."""
    if verb == "/bind":
        return {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n-free"}
    args: dict[str, Any] = {"Pod": fakes.gpu_pod("p", mem=8000), "Nodes": None}
    if verb == "/preempt":
        args["NodeNameToMetaVictims"] = {"n-free": {"Pods": [{"UID": "v"}], "NumPDBViolations": 0}}
    else:
        args["NodeNames"] = ["n-free", "n-two"]
    return args


_HOLE = "__hole__"
_HOLE_JSON = json.dumps(_HOLE).encode()


def _nested(depth: int, kind: str) -> bytes:
    """``depth`` levels of arrays, objects or both alternating, around a scalar."""
    opens: list[bytes] = []
    closes: list[bytes] = []
    for level in range(depth):
        array = kind == "array" or (kind == "mixed" and level % 2 == 0)
        opens.append(b"[" if array else b'{"k":')
        closes.append(b"]" if array else b"}")
    return b"".join(opens) + b"1" + b"".join(reversed(closes))


def _body(verb: str, place: str, nested: bytes) -> tuple[bytes, int]:
    """A body for ``verb`` with ``nested`` at ``place``, and how many levels enclose it."""
    if place == "bare":
        return nested, 0
    body = _valid(verb)
    if place == "unknown-top":
        body["Zz"] = _HOLE
        enclosing = 1
    elif verb == "/bind":  # no pod: known = PodName, unknown = a top-level field too
        body["PodName" if place == "known" else "Extra"] = _HOLE
        enclosing = 1
    elif place == "known":
        body["Pod"]["spec"]["containers"] = _HOLE  # wrong type when nested: a 400 either way
        enclosing = 3  # the body, Pod, spec
    else:  # unknown field deep in the pod, inside known structure
        body["Pod"]["spec"]["containers"][0]["resources"]["zz"] = _HOLE
        enclosing = 6  # the body, Pod, spec, containers, the container, resources
    return json.dumps(body).encode().replace(_HOLE_JSON, nested), enclosing


@settings(max_examples=150, deadline=None)
@given(
    verb=st.sampled_from(VERBS),
    depth=st.one_of(st.integers(1, 5000), st.integers(LIMIT - 6, LIMIT + 2)),
    kind=st.sampled_from(["array", "object", "mixed"]),
    place=st.sampled_from(["bare", "unknown-top", "known", "unknown-deep"]),
)
def test_any_nesting_on_any_verb_is_200_or_400(
    client: TestClient, verb: str, depth: int, kind: str, place: str
) -> None:
    data, enclosing = _body(verb, place, _nested(depth, kind))
    r = client.post(verb, content=data, headers={"content-type": "application/json"})
    if depth + enclosing > LIMIT:
        assert (r.status_code, r.text) == (400, TOO_DEEP)
    elif place in ("unknown-top", "unknown-deep"):
        assert r.status_code == 200, r.text  # unknown fields are ignored, however nested
    else:
        assert r.status_code in (200, 400), r.text


def test_deep_json_inside_strings_is_not_nesting() -> None:
    pod = fakes.gpu_pod("s", mem=1000, annotations={"example.com/blob": "[" * 10_000 + '\\"{' * 1000})
    with TestClient(apps.create_app(_deps()), raise_server_exceptions=False) as c:
        r = c.post("/filter", json={"Pod": pod, "NodeNames": ["n-free"]})
    assert r.status_code == 200
    assert r.json()["NodeNames"] == ["n-free"], r.json()


@pytest.mark.parametrize("verb", VERBS)
def test_recursion_error_is_a_400_even_without_the_depth_check(
    client: TestClient, verb: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsondepth, "too_deep", lambda data, limit: False)
    data, _ = _body(verb, "unknown-top", _nested(50_000, "array"))
    r = client.post(verb, content=data)
    assert r.status_code == 400
    assert "nested too deeply" in r.text


@pytest.mark.parametrize("verb", VERBS)
def test_body_over_the_limit_is_413_declared_or_streamed(verb: str) -> None:
    app = apps.create_app(_deps(config.Settings(events=False, body_limit_bytes=2048)))
    big = json.dumps({**_valid(verb), "Pad": "x" * 4096}).encode()
    with TestClient(app, raise_server_exceptions=False) as c:
        declared = c.post(verb, content=big)
        streamed = c.post(verb, content=iter([big[:1000], big[1000:]]))  # chunked: no content-length
        fits = c.post(verb, json=_valid(verb))
    assert (declared.status_code, streamed.status_code) == (413, 413)
    assert "larger than 2048 bytes" in declared.text
    assert fits.status_code == 200


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{",
        b'{"Pod": {"metadata": {"name": 5}}}',
        b'{"Pod": {"metadata": {"uid": "\xff\xfe"}}, "NodeNames": ["a"]}',
        b'{"NodeNames": [1e999999], "Pod": {}}',
        b'{"NumPDBViolations": 123456789012345678901234567890}',
        b"\x00\x01\x02garbage",
        b"null",
        b"[]",
        b'"just a string"',
    ],
)
@pytest.mark.parametrize("verb", VERBS)
def test_malformed_bodies_are_4xx(client: TestClient, verb: str, data: bytes) -> None:
    r = client.post(verb, content=data)
    assert 200 <= r.status_code < 500, r.text


def test_request_memo_ignores_large_unrelated_annotations() -> None:
    # Pods of one workload that differ only in a 200 KB unrelated annotation share one parse, keyed
    # (and kept) without that annotation; a GPU annotation still makes a different key.
    requests_ = apps._Requests(config.Settings())
    big = {"kubectl.kubernetes.io/last-applied-configuration": "x" * 200_000, keys.USE_GPU_TYPE: "A100"}

    def pod(name: str, annotations: dict[str, str]) -> wire.Pod:
        return msgspec.convert(fakes.gpu_pod(name, mem=8000, annotations=annotations), wire.Pod)

    a = requests_.parse(pod("a", big))
    b = requests_.parse(pod("b", {keys.USE_GPU_TYPE: "A100"}))
    c = requests_.parse(pod("c", {keys.USE_GPU_TYPE: "H100"}))
    assert not isinstance(a, status.Status) and not isinstance(b, status.Status)
    assert not isinstance(c, status.Status)
    assert (a.name, b.name) == ("a", "b")
    assert a.selectors == b.selectors != c.selectors
    assert len(requests_._by_spec) == 2
    assert max(len(key) for key in requests_._by_spec) < 1000


# ----------------------------------------------------------------------------- jsondepth


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


_TRICKY = st.lists(st.sampled_from([*'[]{}"\\:,a é\n', "\\\\", '\\"', "\u2028"]), max_size=12).map("".join)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY, inner, max_size=3),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(value=_JSON, ascii_only=st.booleans(), as_string=st.integers(0, 2))
def test_max_depth_matches_a_parser(value: Any, ascii_only: bool, as_string: int) -> None:
    for _ in range(as_string):  # JSON inside a JSON string, escapes inside escapes
        value = json.dumps(value)
    data = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert jsondepth.max_depth(data) == _depth(value)
    assert jsondepth.too_deep(data, 3) == (_depth(value) > 3)


def test_max_depth_of_invalid_json_never_understates_the_valid_prefix() -> None:
    assert jsondepth.max_depth(b"[[[[") == 4
    assert jsondepth.max_depth(b'["]]]]", [[[') == 4
    assert jsondepth.max_depth(b'["\\\\"[[[') == 4  # the quote after an escaped backslash ends the string
    assert jsondepth.max_depth(b'["\\"[[[') == 1  # an escaped quote does not
    assert jsondepth.max_depth(b"]]][[") == 0


# ----------------------------------------------------------------------------- slow clients

HEADER_S = 1.0
BODY_S = 1.0


class _Server:
    """A real uvicorn with the timeout protocol, serving the app in a thread."""

    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port: int = sock.getsockname()[1]
        sock.close()
        self.tls = tls
        self.config = uvicorn.Config(
            apps.create_app(_deps()),
            host="127.0.0.1",
            port=self.port,
            http=httpserver.protocol_class(HEADER_S, BODY_S),
            ws="none",
            loop="uvloop",
            lifespan="on",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=5,
            ssl_certfile=str(tls[0]) if tls else None,
            ssl_keyfile=str(tls[1]) if tls else None,
        )
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if self.tls is None:
            return sock
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context.wrap_socket(sock)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    with _Server() as s:
        yield s


def _wait_closed(socks: list[socket.socket], timeout: float) -> tuple[list[bytes], float]:
    """Read every socket until the server closes it (then close it here): what each got, and when
    the last one closed. Fails if any is still open after ``timeout`` seconds."""
    got: dict[socket.socket, bytes] = {s: b"" for s in socks}
    open_ = set(socks)
    start = time.monotonic()
    with selectors.DefaultSelector() as sel:
        try:
            for s in socks:
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, s)
            while open_ and time.monotonic() - start < timeout:
                for key, _ in sel.select(0.05):
                    s = key.data
                    try:
                        chunk = s.recv(65536)
                    except ssl.SSLWantReadError:
                        continue
                    except (ConnectionResetError, ssl.SSLError):
                        chunk = b""
                    if chunk:
                        got[s] += chunk
                    else:
                        sel.unregister(s)
                        open_.discard(s)
            elapsed = time.monotonic() - start
        finally:
            for s in socks:
                s.close()
    assert not open_, f"{len(open_)} of {len(socks)} connections still open after {timeout} s"
    return list(got.values()), elapsed


def _request(srv: _Server, raw: bytes) -> bytes:
    with contextlib.closing(srv.connect()) as s:
        s.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith((b"ok", b"}", b"]")):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def _filter_request() -> bytes:
    body = json.dumps(_valid("/filter")).encode()
    head = f"POST /filter HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _connections(srv: _Server, n: int, send: bytes) -> list[socket.socket]:
    socks = [srv.connect() for _ in range(n)]
    for s in socks:
        if send:
            s.sendall(send)
    return socks


def test_half_a_header_line_is_closed_after_the_header_timeout(server: _Server) -> None:
    socks = _connections(server, 50, b"POST /filter HTTP/1.1\r\nHost: t\r\nContent-Le")
    got, elapsed = _wait_closed(socks, HEADER_S + 1)
    assert elapsed >= HEADER_S * 0.9
    assert all(g == b"" or g.startswith(b"HTTP/1.1 408 ") for g in got)
    assert _request(server, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").startswith(b"HTTP/1.1 200 ")


def test_silent_connections_are_closed_after_the_header_timeout(server: _Server) -> None:
    got, _ = _wait_closed(_connections(server, 20, b""), HEADER_S + 1)
    assert set(got) == {b""}


def test_half_a_body_gets_408_after_the_body_timeout(server: _Server) -> None:
    head = (
        b"POST /filter HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    )
    socks = _connections(server, 50, head + b'{"Pod": {"metadata"')
    got, elapsed = _wait_closed(socks, BODY_S + 1)
    assert elapsed >= BODY_S * 0.9
    assert all(g.startswith(b"HTTP/1.1 408 ") for g in got), got[0]
    answer = _request(server, _filter_request())
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_keep_alive_connection_gets_a_new_header_deadline_per_request(server: _Server) -> None:
    socks = _connections(server, 5, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    for s in socks:
        assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
    time.sleep(HEADER_S + 0.3)  # idle, not late: the keep-alive timeout (5 s) applies
    for i, s in enumerate(socks):
        s.sendall(b"GET /heal" if i % 2 else b"\r\n")  # half a request, or bytes that start none
    got, _ = _wait_closed(socks, HEADER_S + 1)
    assert len(got) == 5


def test_chunked_body_that_never_ends_is_cut_off(server: _Server) -> None:
    head = b"POST /filter HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    got, _ = _wait_closed(_connections(server, 5, head + b"5\r\n[1,2]\r\n"), BODY_S + 1)
    assert all(g.startswith(b"HTTP/1.1 408 ") for g in got)


def test_endless_header_is_cut_off_at_the_head_limit(server: _Server) -> None:
    sock = server.connect()
    sock.sendall(b"POST /filter HTTP/1.1\r\nHost: t\r\nX-Big: ")
    start = time.monotonic()
    with contextlib.suppress(OSError):  # the server closes while we send
        for _ in range(16 * httpserver.TimeoutProtocol.max_head_bytes // 65536):
            sock.sendall(b"a" * 65536)
    got, _ = _wait_closed([sock], HEADER_S + 1)
    assert time.monotonic() - start < HEADER_S * 0.9  # cut off by size, not by the header timeout
    assert got[0] == b"" or got[0].startswith(b"HTTP/1.1 431 ")


def test_timeouts_hold_over_tls(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(  # noqa: S603 - fixed arguments
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    with _Server(tls=(cert, key)) as srv:
        assert _request(srv, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").startswith(b"HTTP/1.1 200 ")
        _wait_closed(_connections(srv, 5, b"POST /filter HTTP/1.1\r\nHo"), HEADER_S + 1)
        assert _request(srv, _filter_request()).startswith(b"HTTP/1.1 200 ")


def test_protocol_class_rejects_non_positive_timeouts() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        httpserver.protocol_class(0, 1)
    cls = httpserver.protocol_class(2.5, 3)
    assert (cls.header_timeout_s, cls.body_timeout_s) == (2.5, 3.0)
    assert issubclass(cls, httpserver.TimeoutProtocol)
