"""uvicorn's httptools protocol with header and body timeouts and a bound on the request head.

uvicorn (checked up to 0.54) has no timeout for a client that never completes its request: its only
timer is the keep-alive one, armed after a response and cancelled by any byte received. A client
that connects and sends nothing, half a request line, or headers and half a body (slowloris) holds
its connection, and a slot of ``limit_concurrency``, for as long as it likes. ``protocol_class``
returns a subclass of ``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`` that adds:

* a **header deadline**: armed when the connection is made, and on a keep-alive connection when
  bytes of a next request arrive (the wait between requests is uvicorn's keep-alive timeout,
  ``timeout_keep_alive``); cancelled when the headers are complete. When it passes, the
  connection is closed (with a 408 if part of a request came and no response is under way);
* a **body deadline**: armed when a request's headers are complete and its body is not, cancelled
  when the body is. When it passes, the request is answered 408 (if its response has not started)
  and the connection closed; the app sees ``http.disconnect`` and anything it sends is dropped;
* a **head size limit**: httptools buffers a request line or header value until it ends, and
  uvicorn sets no bound, so within the header deadline a client could make the server hold
  hundreds of MB; a head still incomplete after ``max_head_bytes`` (1 MiB, Go's
  ``DefaultMaxHeaderBytes``) is answered 431 and the connection closed.

Besides the first header deadline (from ``connection_made``), timers are armed at the end of
``data_received`` and only when a request is left incomplete, so on a keep-alive connection a
request that arrives in one piece (kube-scheduler's usual case) costs no timer at all.

It relies on uvicorn's internals (uvicorn 0.54.0 and httptools 0.9.0 are pinned in
requirements.lock): the parser callbacks (``on_message_begin``, ``on_headers_complete``,
``on_message_complete``), the per-request ``cycle`` (``response_started``, ``response_complete``,
``disconnected``, ``message_event``) and ``timeout_keep_alive_task``. It works the same over TLS:
asyncio's SSL transport hands this protocol decrypted bytes and calls ``connection_made`` once the
handshake is done (the handshake itself is bounded by the event loop's ``ssl_handshake_timeout``,
60 s by default).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol


class TimeoutProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with header and body deadlines and a head size limit (module docstring).

    Use ``protocol_class`` to get a subclass with the deadlines set; the defaults here are
    ``Settings``' defaults.
    """

    header_timeout_s: ClassVar[float] = 10.0
    body_timeout_s: ClassVar[float] = 10.0
    max_head_bytes: ClassVar[int] = 1 << 20

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._in_headers = False
        self._in_body = False
        self._head_bytes = 0

    # ----- connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the header deadline of the first request."""
        super().connection_made(transport)
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the deadlines."""
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Parse ``data``, then arm the deadline of whatever is left incomplete."""
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self._in_body:
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_late)
            return
        if self._in_headers:
            self._head_bytes += len(data)  # may count the end of a previous request: a bound, not a size
            if self._head_bytes > self.max_head_bytes:
                self.logger.debug("closing a connection: request head over %s bytes", self.max_head_bytes)
                self._reject_head(431, f"request head larger than {self.max_head_bytes} bytes")
                return
        if self._header_timer is None and (self._in_headers or self._idle()):
            # Part of a request's head, or bytes that start none (uvicorn has just cancelled its
            # keep-alive timer for them): either way the next headers are due in time.
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def handle_websocket_upgrade(self) -> None:
        """Hand the connection over without our deadlines."""
        self._cancel_timers()
        super().handle_websocket_upgrade()

    # ----- parser callbacks

    def on_message_begin(self) -> None:
        """A request starts: its headers are due."""
        super().on_message_begin()
        self._in_headers = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        """Headers complete: cancel their deadline; the body is due."""
        self._in_headers = False
        self._in_body = True
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """Body complete: cancel its deadline."""
        self._in_body = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    # ----- deadlines

    def _idle(self) -> bool:
        """No request under way and no keep-alive timer to close the connection."""
        cycle = self.cycle
        return self.timeout_keep_alive_task is None and (cycle is None or cycle.response_complete)

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        self.logger.debug(
            "closing a connection: request headers not complete after %ss", self.header_timeout_s
        )
        if self._in_headers:
            self._reject_head(408, f"request headers not received within {self.header_timeout_s:g} s")
        else:  # bytes that started no request
            self.transport.close()

    def _body_late(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        self.logger.debug("closing a connection: request body not complete after %ss", self.body_timeout_s)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if not cycle.response_started:
                self._send_error(408, f"request body not received within {self.body_timeout_s:g} s")
            cycle.disconnected = True  # the app's receive() answers http.disconnect, its sends are dropped
            cycle.message_event.set()
        self.transport.close()

    def _reject_head(self, status: int, message: str) -> None:
        """Answer ``status`` (unless an earlier request's response is under way) and close."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self._send_error(status, message)
        self.transport.close()

    def _send_error(self, status: int, message: str) -> None:
        body = message.encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head.extend([name, b": ", value, b"\r\n"])
        head.extend(
            [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: " + str(len(body)).encode() + b"\r\n",
                b"connection: close\r\n\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(head))


def protocol_class(header_timeout_s: float, body_timeout_s: float) -> type[TimeoutProtocol]:
    """A ``TimeoutProtocol`` subclass with these deadlines, for ``uvicorn.run(http=...)``.

    Args:
        header_timeout_s: seconds for a request's headers to arrive (``Settings.header_timeout_s``).
        body_timeout_s: seconds for a request's body, after its headers (``Settings.body_timeout_s``).

    Raises:
        ValueError: a timeout that is not > 0.
    """
    if not (header_timeout_s > 0 and body_timeout_s > 0):
        raise ValueError("header_timeout_s and body_timeout_s must be > 0")
    attrs = {"header_timeout_s": float(header_timeout_s), "body_timeout_s": float(body_timeout_s)}
    return type("TimeoutProtocol", (TimeoutProtocol,), attrs)
