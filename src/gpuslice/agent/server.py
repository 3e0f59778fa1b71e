"""The agent's small HTTP server: ``GET /metrics``, ``GET /healthz``, ``POST /refresh``.

A standard-library threading server in a daemon thread: three routes do not need a framework,
and it keeps the agent free of an event loop.
"""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too; an empty host means every interface).

    Raises:
        ValueError: no port, or a port outside 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


class AgentServer:
    """Serves the agent's routes on a background thread.

    Args:
        address: ``(host, port)``; port 0 picks a free one (see ``port``).
        render_metrics: returns the exposition body and its content type.
        on_refresh: called by ``POST /refresh``.
        health: returns ``(ok, text)`` for ``/healthz``.
    """

    def __init__(
        self,
        address: tuple[str, int],
        render_metrics: Callable[[], tuple[bytes, str]],
        on_refresh: Callable[[], None],
        health: Callable[[], tuple[bool, str]],
    ) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                if self.path == "/metrics":
                    body, ctype = render_metrics()
                    self._send(200, body, ctype)
                elif self.path in ("/healthz", "/readyz"):
                    ok, text = health()
                    self._send(200 if ok else 503, text.encode() + b"\n", "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")

            def do_POST(self) -> None:  # noqa: N802
                if self.path == "/refresh":
                    on_refresh()
                    self._send(202, b"refresh requested\n", "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
                log.debug("http: " + format, *args)

        self._httpd = http.server.ThreadingHTTPServer(address, Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="gpuslice-agent-http", daemon=True
        )

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        """Serve in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
