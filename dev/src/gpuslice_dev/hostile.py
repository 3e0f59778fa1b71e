"""Hostile HTTP clients for ``gpuslice serve``: fuzzed malformed requests and slow connections.

The chaos tier (``tests/chaos/test_hostile_http.py``) and ``bench/bench_fuzz.py`` both use them.

* ``probes(n, seed)``: ``n`` complete raw HTTP/1.1 requests (seeded, reproducible), spread over the
  five verbs: JSON nested thousands of levels deep (bare, in known fields, in unknown fields of
  otherwise valid bodies), truncated JSON, wrong types, huge numbers, invalid UTF-8, a wrong or
  malformed ``Content-Length``, empty bodies, bodies over the limit, random bytes as the body or
  as the whole request, and some well-formed requests. Besides malformed input, syntactically
  valid requests with hostile values: pods asking absurd amounts (``cpu: 1e30``, 2**31 MiB per
  card, negative or fractional counts), names longer than Kubernetes allows (16 KB node names,
  over-long UIDs, namespaces and bind targets), and pods carrying 256 KB of unrelated annotations
  or thousands of labels (what a server must not keep). ``fuzz`` sends them from a thread pool,
  one connection each (``Connection: close``), and counts the answers by status; 0 counts a
  connection closed without an answer (what a server does with some garbage).
* ``SlowClients``: connections that never finish their request (nothing sent, half a request
  line, headers and half a body, or one header byte every half second); ``wait_closed`` reports
  how many the server still holds open after a while.

Nothing here knows gpuslice's internals beyond the wire format kube-scheduler uses
(``k8s.io/kube-scheduler/extender/v1``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import random
import selectors
import socket
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

VERBS = ("/filter", "/prioritize", "/score", "/bind", "/preempt")

KINDS = (
    "deep",
    "deep-unknown",
    "deep-known",
    "shallow-unknown",
    "truncated",
    "wrong-type",
    "huge-number",
    "invalid-utf8",
    "short-length",
    "long-length",
    "bad-length",
    "empty",
    "no-body",
    "oversized",
    "random-body",
    "random-request",
    "bad-chunked",
    "absurd-value",
    "long-name",
    "big-metadata",
    "valid",
)
"""Probe kinds, in the order ``probes`` draws them from (see the module docstring)."""
LEARNING_ARGS = (
    "--node-policy",
    "fgd-lookahead",
    "--workload-min-count",
    "1",
    "--workload-period-s",
    "0",
    "--workload-drift",
    "0",
)
"""``gpuslice serve`` flags under which hostile input reaches furthest: a node policy that learns its
workload, trusting it from the first request, handed each shape at once and re-taking its snapshot
after every request, so one hostile shape that got in would reach every later decision."""
SLOW_KINDS = ("silent", "half-line", "half-body", "trickle")
"""What a slow client sends: nothing, half a request line, headers and half the body, or one
header byte every half second."""


@dataclasses.dataclass(frozen=True)
class Probe:
    """One raw request: its kind, verb and bytes (head and body)."""

    kind: str
    verb: str
    raw: bytes


def pod(name: str, rng: random.Random) -> dict[str, Any]:
    """A GPU pod as kube-scheduler sends it."""
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(rng.choice([1000, 4000, 8000]))}
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"fuzz-{name}",
            "resourceVersion": str(rng.randrange(1, 10**6)),
            "annotations": {"example.com/owner": "fuzz"},
        },
        "spec": {
            "schedulerName": "gpuslice-scheduler",
            "containers": [{"name": "main", "image": "pause", "resources": {"limits": limits}}],
        },
    }


def valid_body(verb: str, rng: random.Random, nodes: list[str]) -> dict[str, Any]:
    """A well-formed body for ``verb`` (a pod named at random, candidates from ``nodes``)."""
    name = f"p{rng.randrange(10**6)}"
    if verb == "/bind":
        return {
            "PodName": name,
            "PodNamespace": "default",
            "PodUID": f"fuzz-{name}",
            "Node": rng.choice(nodes),
        }
    body: dict[str, Any] = {"Pod": pod(name, rng), "Nodes": None}
    if verb == "/preempt":
        body["NodeNameToMetaVictims"] = {
            n: {"Pods": [{"UID": "victim"}], "NumPDBViolations": 0} for n in nodes
        }
    else:
        body["NodeNames"] = list(nodes)
    return body


def nested(depth: int, rng: random.Random) -> bytes:
    """``depth`` levels of arrays and/or objects around a scalar."""
    style = rng.choice(("array", "object", "mixed"))
    opens: list[bytes] = []
    closes: list[bytes] = []
    for level in range(depth):
        array = style == "array" or (style == "mixed" and level % 2 == 0)
        opens.append(b"[" if array else b'{"k":')
        closes.append(b"]" if array else b"}")
    return b"".join(opens) + b"0" + b"".join(reversed(closes))


_HOLE = b'"@@hole@@"'


def _with(body: dict[str, Any], path: tuple[str | int, ...], value: bytes) -> bytes:
    """``body`` encoded with the raw JSON ``value`` at ``path`` (created when missing)."""
    target: Any = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _HOLE.decode()[1:-1]
    return json.dumps(body).encode().replace(_HOLE, value, 1)


def _fields(verb: str) -> list[tuple[str | int, ...]]:
    """Paths of known fields of ``verb``'s body."""
    if verb == "/bind":
        return [("PodName",), ("PodNamespace",), ("PodUID",), ("Node",)]
    pod_fields: list[tuple[str | int, ...]] = [
        ("Pod",),
        ("Pod", "metadata"),
        ("Pod", "metadata", "name"),
        ("Pod", "metadata", "uid"),
        ("Pod", "metadata", "annotations"),
        ("Pod", "spec", "containers"),
        ("Pod", "spec", "containers", 0, "resources", "limits"),
    ]
    if verb == "/preempt":
        return [*pod_fields, ("NodeNameToMetaVictims",)]
    return [*pod_fields, ("NodeNames",)]


def _unknown(verb: str) -> list[tuple[str | int, ...]]:
    """Paths of unknown fields in ``verb``'s body, at several depths."""
    if verb == "/bind":
        return [("Extra",), ("Zz",)]
    return [
        ("Extra",),
        ("Pod", "status"),
        ("Pod", "metadata", "managedFields"),
        ("Pod", "spec", "containers", 0, "env"),
        ("Pod", "spec", "containers", 0, "resources", "claims"),
    ]


def request(verb: str, body: bytes, length: bytes | None = None, extra: bytes = b"") -> bytes:
    """One raw POST of ``body`` to ``verb`` (``length``: a Content-Length other than the body's)."""
    declared = str(len(body)).encode() if length is None else length
    head = b"POST " + verb.encode() + b" HTTP/1.1\r\nHost: gpuslice\r\nContent-Type: application/json\r\n"
    return head + b"Content-Length: " + declared + b"\r\nConnection: close\r\n" + extra + b"\r\n" + body


def _wrong_value(rng: random.Random) -> bytes:
    return rng.choice(
        [b"1", b"-1", b"true", b"null", b'"s"', b"[]", b"{}", b"[1,{}]", b'{"a":[null]}', b"1.5e3"]
    )


def _huge_number(rng: random.Random) -> bytes:
    return rng.choice(
        [
            b"1e999999",
            b"-1e309",
            b"9" * 400,
            b"-" + b"9" * 5000,
            b"123456789012345678901234567890",
            b"0." + b"1" * 3000,
        ]
    )


ABSURD_AMOUNTS = {
    "cpu": ["1e30", "-1", "9" * 30, "2Ei"],
    "memory": ["1e40", "-1Gi", "8Ei"],
    "nvidia.com/gpu": ["2147483647", "-1", "500m", "1025", "1e12"],
    "nvidia.com/gpumem": ["2147483648", "16Gi", "-5", "1e30"],
    "nvidia.com/gpucores": ["99999999999", "-1", "1e18"],
    "nvidia.com/gpumem-percentage": ["4294967346", "-1", "1e9"],
}
"""Valid quantities no node could satisfy (or HAMi's parser would drop), per resource."""


def _absurd(body: dict[str, Any], verb: str, rng: random.Random) -> dict[str, Any]:
    """``body`` with absurd amounts in its pod's limits, requests or an init container."""
    if verb == "/bind":
        return {**body, "Node": "n" * rng.choice([254, 4096]), "PodUID": "u" * rng.choice([36, 300])}
    pod = body["Pod"]
    container = pod["spec"]["containers"][0]
    if rng.random() < 0.3:
        container = {"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        pod["spec"]["initContainers"] = [container]
    part = "requests" if rng.random() < 0.3 else "limits"
    amounts = container["resources"].setdefault(part, {})
    for name in rng.sample(sorted(ABSURD_AMOUNTS), rng.randint(1, 3)):
        amounts[name] = rng.choice(ABSURD_AMOUNTS[name])
    return body


def _long_name(body: dict[str, Any], verb: str, rng: random.Random, nodes: list[str]) -> dict[str, Any]:
    """``body`` with a name, UID or namespace longer than Kubernetes allows."""
    long = f"{rng.randrange(10**9)}-" + "x" * rng.choice([254, 1000, 16_000])
    if verb == "/bind":
        field = rng.choice(["Node", "PodName", "PodUID", "PodNamespace"])
        return {**body, field: long}
    where = rng.choice(["names", "uid", "namespace", "name", "owner"])
    meta = body["Pod"]["metadata"]
    if where == "names":
        names = [f"{i}-{long}" for i in range(rng.randint(1, 50))] + list(nodes)
        if verb == "/preempt":
            body["NodeNameToMetaVictims"] = {
                n: {"Pods": [{"UID": "v"}], "NumPDBViolations": 0} for n in names
            }
        else:
            body["NodeNames"] = names
    elif where == "owner":
        meta["ownerReferences"] = [{"uid": long, "controller": True}]
    else:
        meta[where] = long
    return body


def _big_metadata(body: dict[str, Any], verb: str, rng: random.Random) -> dict[str, Any]:
    """``body`` whose pod carries 256 KB of unrelated annotations or thousands of labels."""
    if verb == "/bind":
        return body
    meta = body["Pod"]["metadata"]
    tag = rng.randrange(10**9)
    if rng.random() < 0.5:
        meta["annotations"][f"example.com/blob-{tag}"] = "a" * (256 * 1024 - 64)
    else:
        meta["labels"] = {f"example.com/l{j}": f"{tag}-{j}" for j in range(4096)}
    return body


def probe(kind: str, verb: str, rng: random.Random, nodes: list[str], body_limit: int) -> Probe:
    """One request of ``kind`` for ``verb``."""
    body = valid_body(verb, rng, nodes)
    data = json.dumps(body).encode()
    raw: bytes
    if kind == "deep":
        raw = request(verb, nested(rng.randint(65, 20_000), rng))
    elif kind == "deep-unknown":
        raw = request(verb, _with(body, rng.choice(_unknown(verb)), nested(rng.randint(60, 20_000), rng)))
    elif kind == "deep-known":
        raw = request(verb, _with(body, rng.choice(_fields(verb)), nested(rng.randint(1, 20_000), rng)))
    elif kind == "shallow-unknown":
        raw = request(verb, _with(body, rng.choice(_unknown(verb)), nested(rng.randint(1, 50), rng)))
    elif kind == "truncated":
        raw = request(verb, data[: rng.randrange(len(data))])
    elif kind == "wrong-type":
        raw = request(verb, _with(body, rng.choice(_fields(verb)), _wrong_value(rng)))
    elif kind == "huge-number":
        path = rng.choice([*_fields(verb), *_unknown(verb)])
        if verb == "/preempt" and rng.random() < 0.5:
            path = ("NodeNameToMetaVictims", nodes[0], "NumPDBViolations")
        raw = request(verb, _with(body, path, _huge_number(rng)))
    elif kind == "invalid-utf8":
        bad = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x00", b"\x1f"])
        at = data.index(b'"', rng.randrange(len(data) // 2)) + 1
        raw = request(verb, data[:at] + bad + data[at:])
    elif kind == "short-length":  # the rest of the body is read as the next (garbage) request
        raw = request(verb, data, length=str(rng.randrange(len(data))).encode())
    elif kind == "long-length":  # the server waits for bytes that never come: its body timeout
        raw = request(verb, data, length=str(len(data) + rng.randint(1, 1000)).encode())
    elif kind == "bad-length":
        length = rng.choice([b"abc", b"-1", b"1e3", b"0x10", b"", b"99999999999999999999999", b"5, 6"])
        raw = request(verb, data, length=length)
    elif kind == "empty":
        raw = request(verb, b"")
    elif kind == "no-body":
        raw = b"POST " + verb.encode() + b" HTTP/1.1\r\nHost: gpuslice\r\nConnection: close\r\n\r\n"
    elif kind == "oversized":
        raw = request(verb, b'{"Pad":"' + b"x" * body_limit + b'"}')
    elif kind == "random-body":
        raw = request(verb, rng.randbytes(rng.randint(1, 4096)))
    elif kind == "random-request":
        raw = rng.randbytes(rng.randint(1, 2048)) + b"\r\n\r\n"
    elif kind == "bad-chunked":
        chunks = rng.choice(
            [b"zz\r\n{}\r\n0\r\n\r\n", b"5\r\n{}\r\n0\r\n\r\n", b"-1\r\n\r\n", b"ffffffffffffffffff\r\n"]
        )
        head = b"POST " + verb.encode() + b" HTTP/1.1\r\nHost: gpuslice\r\nTransfer-Encoding: chunked\r\n"
        raw = head + b"Connection: close\r\n\r\n" + chunks
    elif kind == "absurd-value":
        raw = request(verb, json.dumps(_absurd(body, verb, rng)).encode())
    elif kind == "long-name":
        raw = request(verb, json.dumps(_long_name(body, verb, rng, nodes)).encode())
    elif kind == "big-metadata":
        raw = request(verb, json.dumps(_big_metadata(body, verb, rng)).encode())
    elif kind == "valid":
        raw = request(verb, data)
    else:
        raise ValueError(f"unknown probe kind {kind!r}")
    return Probe(kind, verb, raw)


def probes(n: int, seed: int, nodes: list[str], body_limit: int = 1 << 20) -> list[Probe]:
    """``n`` probes, kinds and verbs in turn, details drawn from ``seed``.

    ``long-length`` probes wait for the server's body timeout, so they are one in 50.
    """
    rng = random.Random(seed)
    kinds = [k for k in KINDS if k != "long-length"]
    out: list[Probe] = []
    for i in range(n):
        kind = "long-length" if i % 50 == 49 else kinds[i % len(kinds)]
        out.append(probe(kind, VERBS[(i // len(kinds)) % len(VERBS)], rng, nodes, body_limit))
    return out


def send(host: str, port: int, raw: bytes, timeout: float = 30.0) -> int:
    """Send one raw request on a new connection and read until the server closes it.

    Returns:
        The status code of the first answer, 0 when the connection closed without one.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # the server may answer and close before all is sent
            sock.sendall(raw)
        data = b""
        try:
            while b"\r\n" not in data or not _complete(data):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    while data.startswith(b"HTTP/1.1 1") and b"\r\n\r\n" in data:  # an interim answer (100 Continue)
        data = data.partition(b"\r\n\r\n")[2]
    if not data.startswith(b"HTTP/1.1 "):
        return 0
    return int(data[9:12])


def _complete(data: bytes) -> bool:
    """True once a whole answer with a Content-Length is in ``data``."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(body) >= int(value)
    return False


WAITING_KINDS = frozenset({"long-length"})
"""Probes answered only when the server's body timeout passes."""


def fuzz(
    host: str, port: int, requests: Iterable[Probe], workers: int = 8, timeout: float = 30.0
) -> dict[str, collections.Counter[int]]:
    """Send every probe; status code counts per probe kind.

    ``workers`` send at a time; the probes of ``WAITING_KINDS`` are all sent at once besides them
    (up to 256), so their waits overlap instead of adding up.
    """
    todo = list(requests)
    waiting = [p for p in todo if p.kind in WAITING_KINDS]
    quick = [p for p in todo if p.kind not in WAITING_KINDS]

    def one(p: Probe) -> tuple[str, int]:
        return p.kind, send(host, port, p.raw, timeout)

    with ThreadPoolExecutor(max(1, min(256, len(waiting)))) as slow, ThreadPoolExecutor(workers) as pool:
        held = [slow.submit(one, p) for p in waiting]
        answers = list(pool.map(one, quick)) + [f.result() for f in held]
    out: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for kind, code in answers:
        out[kind][code] += 1
    return dict(out)


def total(counts: dict[str, collections.Counter[int]]) -> collections.Counter[int]:
    """All kinds' counts summed."""
    out: collections.Counter[int] = collections.Counter()
    for c in counts.values():
        out.update(c)
    return out


class SlowClients:
    """Connections that never complete a request (``SLOW_KINDS`` in turn).

    Args:
        host: server host.
        port: server port.
        n: how many connections.
        path: the request path they start.
    """

    def __init__(self, host: str, port: int, n: int, path: str = "/filter") -> None:
        head = f"POST {path} HTTP/1.1\r\nHost: gpuslice\r\nContent-Type: application/json\r\n"
        self._half_line = head.encode()[: len(head) // 2]
        self._half_body = (head + "Content-Length: 4000\r\n\r\n").encode() + b'{"Pod": {"metadata": {'
        self._trickle = (head + "Content-Length: 2\r\n").encode()
        self.kinds: list[str] = []
        self.socks: list[socket.socket] = []
        self._sent: dict[socket.socket, int] = {}
        for i in range(n):
            kind = SLOW_KINDS[i % len(SLOW_KINDS)]
            sock = socket.create_connection((host, port), timeout=10)
            sock.setblocking(False)
            first = {"silent": b"", "half-line": self._half_line, "half-body": self._half_body}.get(kind, b"")
            if first:
                sock.sendall(first)
            self.kinds.append(kind)
            self.socks.append(sock)
            self._sent[sock] = 0
        self.opened = time.monotonic()

    def wait_closed(self, seconds: float, on_tick: Callable[[], None] | None = None) -> dict[str, int]:
        """Keep the trickle going for ``seconds``; then how many of each kind are still open.

        Args:
            seconds: how long to wait, from now.
            on_tick: called about every half second while waiting (e.g. a normal request).
        """
        open_ = dict(zip(self.socks, self.kinds, strict=True))
        deadline = time.monotonic() + seconds
        next_byte = time.monotonic()
        with selectors.DefaultSelector() as sel:
            for sock in open_:
                sel.register(sock, selectors.EVENT_READ, sock)
            while open_ and time.monotonic() < deadline:
                for key, _ in sel.select(0.1):
                    sock = key.data
                    try:
                        chunk = sock.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    if not chunk:  # closed by the server (an answer before it is fine: 408)
                        sel.unregister(sock)
                        del open_[sock]
                if time.monotonic() >= next_byte:
                    next_byte += 0.5
                    self._trickle_once(open_)
                    if on_tick is not None:
                        on_tick()
        return dict(collections.Counter(open_.values()))

    def _trickle_once(self, open_: dict[socket.socket, str]) -> None:
        for sock, kind in open_.items():
            if kind != "trickle":
                continue
            at = self._sent[sock]
            if at < len(self._trickle):
                with contextlib.suppress(OSError):
                    sock.send(self._trickle[at : at + 1])
                self._sent[sock] = at + 1

    def close(self) -> None:
        """Close every connection still open on this side."""
        for sock in self.socks:
            sock.close()

    def __enter__(self) -> SlowClients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MEMORY_CASES = ("annotations", "over-long names", "names at the limit")
"""What a memory probe sends (``memory_probe``): pods carrying 256 KB of unrelated annotations
(filter), 50 distinct 16 KB node names (prioritize, refused), 50 distinct names of 253 characters
(prioritize, answered)."""


def memory_probe(case: str, i: int, rng: random.Random, nodes: list[str]) -> tuple[str, dict[str, Any], int]:
    """The ``i``-th request of a ``MEMORY_CASES`` case: its verb, body and the status it must get.

    Every request names new things (a new pod UID, new node names), as a stream of pods that were
    never created in the API would, so nothing a server keeps per pod or per name is reused.
    """
    if case == "annotations":
        body = valid_body("/filter", rng, nodes)
        meta = body["Pod"]["metadata"]
        meta["uid"] = f"memory-{i}"
        meta["annotations"]["example.com/blob"] = f"{i}" + "a" * (256 * 1024)
        return "/filter", body, 200
    pod = valid_body("/prioritize", rng, nodes)["Pod"]
    if case == "over-long names":
        names = [f"{i:05d}-{j:02d}-" + "x" * 16_000 for j in range(50)]
        return "/prioritize", {"Pod": pod, "NodeNames": names}, 400
    if case == "names at the limit":
        names = [f"{i:05d}-{j:02d}-".ljust(253, "x") for j in range(50)]
        return "/prioritize", {"Pod": pod, "NodeNames": names}, 200
    raise ValueError(f"unknown memory case {case!r}")


def settled_rss(pid: int, seconds: float = 20.0, still_mb: float = 1.0) -> float:
    """A resident set (MiB) once it stops moving (under ``still_mb`` over 1 s), or after ``seconds``."""
    deadline = time.monotonic() + seconds
    last = rss_mb(pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = rss_mb(pid)
        if abs(now - last) < still_mb:
            return now
        last = now
    return last


def rss_mb(pid: int) -> float:
    """A process's resident set (``VmRSS``) in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for pid {pid}")
