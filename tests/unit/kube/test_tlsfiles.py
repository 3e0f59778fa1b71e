"""Certificate files: serial and notAfter read from DER, the reloader's rules on a bare SSL context.

The handshakes themselves (new connections get the new certificate) are checked against real
servers in ``tests/unit/extender/test_tls_reload.py`` and ``tests/unit/webhook/test_tls_reload.py``.
"""

from __future__ import annotations

import logging
import ssl
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuslice.kube import tlsfiles, x509
from tests import pki

pytestmark = pytest.mark.unit

DAY = 86400.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pki.Pki:
    return pki.make(tmp_path_factory.mktemp("pki"))


def _serial(cert: Path) -> int:
    out = subprocess.run(  # noqa: S603, S607
        ["openssl", "x509", "-in", str(cert), "-noout", "-serial"], check=True, capture_output=True, text=True
    ).stdout
    return int(out.strip().removeprefix("serial="), 16)


def _self_signed(directory: Path, name: str, days: int) -> Path:
    args = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    subprocess.run(  # noqa: S603, S607
        [
            "openssl",
            *args,
            "-days",
            str(days),
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.crt",
        ],
        check=True,
        capture_output=True,
        cwd=directory,
    )
    return directory / f"{name}.crt"


def test_serial_and_not_after_match_openssl(certs: pki.Pki, tmp_path: Path) -> None:
    far = _self_signed(tmp_path, "far", 40000)  # past 2049: GeneralizedTime instead of UTCTime
    bundle = certs.server_cert.read_bytes() + b"\n" + far.read_bytes()
    got = x509.certificates(bundle)
    assert [(c.serial, c.not_after) for c in got] == [
        (_serial(certs.server_cert), pki.not_after(certs.server_cert)),
        (_serial(far), pki.not_after(far)),
    ]


@pytest.mark.parametrize(
    "pem",
    [
        b"",
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n",  # a SEQUENCE cut short
    ],
    ids=["empty", "no-certificate", "not-base64", "truncated-der"],
)
def test_what_is_not_a_certificate_is_refused(pem: bytes) -> None:
    with pytest.raises(ValueError):
        x509.certificates(pem)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _reloader(certs: pki.Pki, clock: Clock) -> tuple[tlsfiles.Reloader, CollectorRegistry]:
    registry = CollectorRegistry()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    files = tlsfiles.Files(str(certs.server_cert), str(certs.server_key), str(certs.ca))
    return tlsfiles.Reloader(context, files, tlsfiles.Metrics(registry), clock=clock), registry


def test_expiry_gauges_and_the_thirty_day_warning(certs: pki.Pki, caplog: pytest.LogCaptureFixture) -> None:
    not_after = pki.not_after(certs.server_cert)
    clock = Clock(not_after - 31 * DAY)
    reloader, registry = _reloader(certs, clock)
    with caplog.at_level(logging.INFO, logger="gpuslice.kube.tlsfiles"):
        assert reloader.check() is True
        assert reloader.check() is False  # unchanged files: nothing loaded
        assert [r for r in caplog.records if r.levelno == logging.WARNING] == []  # 31 days left
        clock.now = not_after - 29 * DAY
        reloader.check()
        clock.now += DAY / 2
        reloader.check()  # warned once a day, not at every poll
        clock.now += DAY
        reloader.check()
        clock.now = not_after + DAY
        reloader.check()
    warned: list[str] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(" (")[0] for w in warned if "serving" in w] == [
        "tls: the serving certificate expires in 29.0 days",
        "tls: the serving certificate expires in 27.5 days",
        "tls: the serving certificate expired 1.0 days ago",
    ]
    expiry = "gpuslice_tls_certificate_expiry_timestamp_seconds"
    assert registry.get_sample_value(expiry, {"certificate": "serving"}) == not_after
    assert registry.get_sample_value(expiry, {"certificate": "client_ca"}) == pki.not_after(certs.ca)
    reloads = "gpuslice_tls_certificate_reloads_total"
    assert registry.get_sample_value(reloads, {"result": "success"}) == 0.0  # the first load is no reload
    assert any("loaded serving certificate serial=" in r.getMessage() for r in caplog.records)


def test_an_unreadable_file_is_logged_once_and_retried(
    certs: pki.Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mount = tmp_path / "tls"
    pki.publish(mount, {"tls.crt": certs.server_cert.read_bytes(), "tls.key": certs.server_key.read_bytes()})
    registry = CollectorRegistry()
    files = tlsfiles.Files(str(mount / "tls.crt"), str(mount / "tls.key"))
    reloader = tlsfiles.Reloader(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), files, tlsfiles.Metrics(registry))
    assert reloader.check() is True
    (mount / "tls.key").unlink()
    with caplog.at_level(logging.WARNING, logger="gpuslice.kube.tlsfiles"):
        assert reloader.check() is False
        assert reloader.check() is False
    assert len([r for r in caplog.records if "cannot read" in r.getMessage()]) == 1
    renewed = pki.server(certs, "unreadable-then", days=3)
    pki.publish(mount, {"tls.crt": renewed[0].read_bytes(), "tls.key": renewed[1].read_bytes()})
    assert reloader.check() is True
    assert registry.get_sample_value("gpuslice_tls_certificate_reloads_total", {"result": "success"}) == 1.0
    assert reloader.expiry["serving"] == pki.not_after(renewed[0])
