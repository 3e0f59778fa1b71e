"""`helm test` check of a gpuslice release: each Service answers its health path.

Runs in the gpuslice image (Python, no curl). The checks come as JSON in ``GPUSLICE_CHECKS``: a list
of ``{"name", "service", "namespace", "port_name", "port", "path", "scheme"}`` plus, for HTTPS,
``"ca"`` (a CA file) and ``"server_name"`` (the name the certificate must carry); scheme ``tcp``
only opens a connection. A Service is reached at the address kubelet puts in the pod's environment
(``<SERVICE>_SERVICE_HOST`` and ``<SERVICE>_SERVICE_PORT_<PORT>``), which needs no cluster DNS;
without it, at its DNS name. HTTPS
connects to that address and verifies the certificate against the CA under ``server_name``, the
Service's DNS name (the certificate names no ClusterIP). Each check is retried until
``GPUSLICE_CHECK_TIMEOUT_S`` (default 60) runs out. Exit 0 when every check got HTTP 200.
"""

import http.client
import json
import os
import socket
import ssl
import sys
import time


def _env_name(service: str) -> str:
    return service.upper().replace("-", "_").replace(".", "_")


def address(check: dict) -> tuple[str, int, str]:
    """Host, port and where they came from (the Service's environment variables or its DNS name)."""
    prefix = _env_name(check["service"])
    host = os.environ.get(f"{prefix}_SERVICE_HOST")
    port = os.environ.get(f"{prefix}_SERVICE_PORT_{_env_name(check['port_name'])}")
    if host and port:
        return host, int(port), f"${prefix}_SERVICE_HOST"
    return f"{check['service']}.{check['namespace']}.svc", int(check["port"]), "cluster DNS"


class _VerifiedHTTPS(http.client.HTTPConnection):
    """HTTPS to an address, verifying the certificate for another name (a Service's DNS name)."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, server_name: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._tls = context
        self._server_name = server_name

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self._server_name)


def probe(check: dict, host: str, port: int) -> tuple[int, str]:
    """One GET: the HTTP status and the start of the body (scheme tcp: 200 once a connection opens)."""
    if check["scheme"] == "tcp":
        with socket.create_connection((host, port), 5):
            return 200, ""
    if check["scheme"] == "https":
        context = ssl.create_default_context(cafile=check["ca"])
        conn: http.client.HTTPConnection = _VerifiedHTTPS(host, port, context, check["server_name"], 5)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", check["path"], headers={"Host": check.get("server_name") or host})
        response = conn.getresponse()
        return response.status, response.read(300).decode(errors="replace").strip()
    finally:
        conn.close()


def run(check: dict, deadline: float) -> str | None:
    """None when the check passes before the deadline, else why it failed."""
    host, port, source = address(check)
    url = f"{check['scheme']}://{host}:{port}{check['path']}"
    service = f"{check['namespace']}/{check['service']}"
    what = "connect to" if check["scheme"] == "tcp" else "GET"
    where = f"{check['name']}: {what} {url} (Service {service}, address from {source})"
    while True:
        try:
            status, body = probe(check, host, port)
            if status == 200:
                print(f"ok   {where}: 200", flush=True)
                return None
            error = f"HTTP {status}: {body}"
        except ssl.SSLError as err:
            error = (
                f"TLS failed ({err}); the certificate must be signed by the CA in {check['ca']}"
                f" and name {check['server_name']}"
            )
        except OSError as err:
            error = f"no answer ({err})"
        if time.monotonic() >= deadline:
            return f"FAIL {where}: {error}"
        time.sleep(2)


def main() -> int:
    """Run every check; print one line each, exit 1 when any failed."""
    checks = json.loads(os.environ["GPUSLICE_CHECKS"])
    deadline = time.monotonic() + float(os.environ.get("GPUSLICE_CHECK_TIMEOUT_S", "60"))
    failures = [f for f in (run(check, deadline) for check in checks) if f]
    for failure in failures:
        print(failure, file=sys.stderr, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
