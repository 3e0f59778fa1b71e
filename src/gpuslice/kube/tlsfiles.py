"""Serving certificates of ``gpuslice serve`` and ``gpuslice webhook``: reloaded on change, expiry exported.

uvicorn loads a listener's certificate once, into the ``ssl.SSLContext`` of ``Config.load()``.
kubelet updates a mounted Secret in place (a new timestamped directory, then an atomic swap of
the ``..data`` symlink), so a certificate renewed by cert-manager reaches the files without a
restart. ``Reloader`` reads the files every ``period_s`` and, when their bytes changed, loads them
again into that same context: OpenSSL gives each new connection the context's certificate at
that moment, so later handshakes present the new one and open connections keep theirs.

* A new pair is first loaded into a scratch context; only when that succeeds is it loaded into
  the live one, from the very bytes checked (in-memory files), because a ``load_cert_chain``
  that fails half-way can leave a context holding the new certificate without its key. A file
  that is half written, not PEM, or whose key does not match is logged and counted, and the old
  certificate keeps serving; it is tried again when the files change again.
* The client CA bundle (mutual TLS) is loaded with ``load_verify_locations``, which adds to the
  context's trust store and can remove nothing: a CA added to the bundle is trusted at once, a CA
  removed from it stays trusted until the process restarts.
* ``gpuslice_tls_certificate_expiry_timestamp_seconds{certificate}`` (``serving``, ``client_ca``)
  is the earliest notAfter (unix seconds) among that file's certificates, set at every load;
  ``gpuslice_tls_certificate_reloads_total{result}`` counts the reloads after the first load
  (``success``, ``failure``). A warning is logged while less than 30 days remain (at each load,
  then once a day).

Both servers import this, and ``kube`` is the lowest layer doing I/O that both stand on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import hashlib
import logging
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuslice.kube import x509

log = logging.getLogger(__name__)

SERVING = "serving"
CLIENT_CA = "client_ca"
PERIOD_S = 5.0
"""How often the files are read."""
WARN_WITHIN_S = 30 * 86400.0
"""A certificate expiring sooner than this is logged as a warning."""
WARN_EVERY_S = 86400.0


class Metrics:
    """The certificate metrics, in the server's registry.

    Attributes:
        expiry: ``gpuslice_tls_certificate_expiry_timestamp_seconds{certificate}``.
        reloads: ``gpuslice_tls_certificate_reloads_total{result}``.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.expiry = Gauge(
            "gpuslice_tls_certificate_expiry_timestamp_seconds",
            "Earliest notAfter (unix seconds) among the certificates of a loaded TLS file, "
            "by certificate (serving, client_ca)",
            ["certificate"],
            registry=registry,
        )
        self.reloads = Counter(
            "gpuslice_tls_certificate_reloads",
            "Reloads of changed TLS files by result (success, failure: the old certificate kept)",
            ["result"],
            registry=registry,
        )
        for result in ("success", "failure"):
            self.reloads.labels(result)


@dataclasses.dataclass(frozen=True)
class Files:
    """A listener's PEM files (``client_ca`` '' when clients are not verified)."""

    cert: str
    key: str
    client_ca: str = ""


@contextlib.contextmanager
def _in_memory(*blobs: bytes) -> Iterator[list[str]]:
    """Paths that read ``blobs``: memfd files where Linux has them, else private temporary files."""
    if hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir():
        fds: list[int] = []
        try:
            for blob in blobs:
                fds.append(os.memfd_create("gpuslice-tls", os.MFD_CLOEXEC))
                view = memoryview(blob)
                while view:
                    view = view[os.write(fds[-1], view) :]
            yield [f"/proc/self/fd/{fd}" for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="gpuslice-tls-") as directory:
        paths = [Path(directory, str(i)) for i in range(len(blobs))]
        for path, blob in zip(paths, blobs, strict=True):
            path.write_bytes(blob)
        yield [str(p) for p in paths]


def _iso(unix: float) -> str:
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reloader:
    """Keeps ``context`` loaded with the current contents of ``files`` (module docstring).

    Args:
        context: the listener's SSL context (``uvicorn.Config.ssl`` after ``load()``).
        files: the PEM files it was loaded from.
        metrics: where the expiry and the reloads are counted.
        period_s: how often ``running`` reads the files.
        clock: wall clock, for the expiry warning.
    """

    def __init__(
        self,
        context: ssl.SSLContext,
        files: Files,
        metrics: Metrics,
        *,
        period_s: float = PERIOD_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.context = context
        self.files = files
        self.metrics = metrics
        self.period_s = period_s
        self.clock = clock
        self.expiry: dict[str, float] = {}
        """Certificate name -> its notAfter as last loaded."""
        self._seen: bytes | None = None  # digest of the contents last acted on (loaded or refused)
        self._problem = ""  # the last read error logged
        self._warned: dict[str, float] = {}

    def _read(self) -> tuple[bytes, bytes, bytes]:
        ca = Path(self.files.client_ca).read_bytes() if self.files.client_ca else b""
        return Path(self.files.cert).read_bytes(), Path(self.files.key).read_bytes(), ca

    def check(self) -> bool:
        """Read the files and load them if they changed since the last check; True when loaded."""
        try:
            contents = self._read()
        except OSError as err:
            if str(err) != self._problem:  # a missing file mid-swap: said once, retried next time
                log.warning("tls: cannot read %s: %s; keeping the current certificate", self.files.cert, err)
                self._problem = str(err)
            return False
        self._problem = ""
        digest = hashlib.sha256(b"\0".join(hashlib.sha256(c).digest() for c in contents)).digest()
        if digest == self._seen:
            self.warn_expiring()
            return False
        first = self._seen is None
        self._seen = digest
        try:
            loaded = self._load(*contents)
        except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
            if not first:
                self.metrics.reloads.labels("failure").inc()
            log.warning(
                "tls: cannot load %s (%s): %s; keeping the current certificate",
                self.files.cert,
                "first load" if first else "changed files",
                err,
            )
            return False
        if not first:
            self.metrics.reloads.labels("success").inc()
        for name, (serial, not_after) in loaded.items():
            self.expiry[name] = not_after
            self.metrics.expiry.labels(name).set(not_after)
            self._warned.pop(name, None)
            log.info(
                "tls: %s %s certificate serial=%x notAfter=%s",
                "loaded" if first else "reloaded",
                name,
                serial,
                _iso(not_after),
            )
        self.warn_expiring()
        return True

    def _load(self, cert: bytes, key: bytes, ca: bytes) -> dict[str, tuple[int, float]]:
        """Check the pair on a scratch context, then load it (and the CA) into the live one.

        Raises:
            OSError: OpenSSL refused a file (``ssl.SSLError``).
            ValueError: a file that is not PEM certificates.
        """
        chain = x509.certificates(cert)
        loaded = {SERVING: (chain[0].serial, min(c.not_after for c in chain))}
        if self.files.client_ca:
            cas = x509.certificates(ca)
            loaded[CLIENT_CA] = (cas[0].serial, min(c.not_after for c in cas))
        scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with _in_memory(cert, key, ca) as (cert_path, key_path, ca_path):
            scratch.load_cert_chain(cert_path, key_path)
            if self.files.client_ca:
                scratch.load_verify_locations(cafile=ca_path)
            self.context.load_cert_chain(cert_path, key_path)
            if self.files.client_ca:
                self.context.load_verify_locations(cafile=ca_path)
        return loaded

    def warn_expiring(self) -> None:
        """Log a warning for each certificate within ``WARN_WITHIN_S`` of expiry (once a day each)."""
        now = self.clock()
        for name, not_after in self.expiry.items():
            left = not_after - now
            if left >= WARN_WITHIN_S or now - self._warned.get(name, -WARN_EVERY_S) < WARN_EVERY_S:
                continue
            self._warned[name] = now
            when = (
                f"expired {-left / 86400:.1f} days ago" if left < 0 else f"expires in {left / 86400:.1f} days"
            )
            log.warning("tls: the %s certificate %s (notAfter=%s)", name, when, _iso(not_after))

    async def run(self) -> None:
        """``check`` every ``period_s``, until cancelled."""
        while True:
            await asyncio.sleep(self.period_s)
            self.check()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Reloader]:
        """Poll the files while the context is open."""
        task = asyncio.create_task(self.run(), name="tls-reload")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def start_reloader(
    context: ssl.SSLContext | None,
    files: Files | None,
    metrics: Metrics,
    *,
    period_s: float = PERIOD_S,
) -> Reloader | None:
    """A listener's reloader with its files loaded once; None when the listener has no TLS.

    Call it after ``uvicorn.Config.load()`` built ``context``: the reloader loads into that very
    context, and runs as a lifespan service (``Reloader.running``).
    """
    if context is None or files is None:
        return None
    reloader = Reloader(context, files, metrics, period_s=period_s)
    reloader.check()
    return reloader
