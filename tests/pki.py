"""A throwaway PKI made with ``openssl``: a CA, a server certificate for 127.0.0.1/localhost, a
client certificate signed by the CA, and a client certificate signed by another CA (a stranger)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import pytest


@dataclasses.dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=cwd)  # noqa: S603, S607


def _ca(name: str, cwd: Path) -> None:
    args = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}"]
    _openssl(*args, "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=cwd)


def _signed(name: str, ca: str, cn: str, ext: str, cwd: Path, days: int = 1) -> None:
    args = ["req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}"]
    _openssl(*args, "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=cwd)
    (cwd / f"{name}.ext").write_text(ext)
    args = [
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.crt",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
    ]
    _openssl(*args, "-days", str(days), "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=cwd)


def server(pki: Pki, name: str, days: int) -> tuple[Path, Path]:
    """Another serving certificate for 127.0.0.1/localhost from ``pki``'s CA, valid ``days``: (cert, key).

    Each has a serial of its own (``-CAcreateserial`` counts up).
    """
    directory = pki.ca.parent
    ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    _signed(name, "ca", "gpuslice", ext, directory, days=days)
    return directory / f"{name}.crt", directory / f"{name}.key"


def not_after(cert: Path) -> float:
    """The certificate's notAfter (unix seconds) as ``openssl x509 -enddate`` prints it."""
    out = subprocess.run(  # noqa: S603, S607
        ["openssl", "x509", "-in", str(cert), "-noout", "-enddate"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(ssl.cert_time_to_seconds(out.strip().removeprefix("notAfter=")))


def publish(directory: Path, files: Mapping[str, bytes]) -> None:
    """Write ``files`` into ``directory`` the way kubelet updates a mounted Secret.

    kubelet's atomic writer puts the new contents in a fresh timestamped directory, points a
    temporary ``..data_tmp`` symlink at it and renames that over ``..data``; each file name is a
    symlink into ``..data``. Readers see the old files or the new ones, never a mix.
    """
    directory.mkdir(parents=True, exist_ok=True)
    old = {p for p in directory.iterdir() if p.name.startswith("..") and p.is_dir() and not p.is_symlink()}
    stamp = directory / f"..{time.time_ns()}"
    stamp.mkdir()
    for name, data in files.items():
        (stamp / name).write_bytes(data)
    (directory / "..data_tmp").symlink_to(stamp.name)
    os.replace(directory / "..data_tmp", directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    for path in old:
        shutil.rmtree(path)


def make(directory: Path) -> Pki:
    """Write the files into ``directory`` (skips the test when ``openssl`` is missing)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", directory)
    _ca("other-ca", directory)
    _signed(
        "server",
        "ca",
        "gpuslice",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        directory,
    )
    _signed("client", "ca", "kube-scheduler", "extendedKeyUsage=clientAuth\n", directory)
    _signed("stranger", "other-ca", "kube-scheduler", "extendedKeyUsage=clientAuth\n", directory)
    return Pki(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        stranger_cert=directory / "stranger.crt",
        stranger_key=directory / "stranger.key",
    )


def peer_certificate(port: int, ca: Path, client: tuple[Path, Path] | None) -> bytes:
    """The DER certificate the server presents in a new handshake (verified against ``ca``).

    Raises:
        ssl.SSLError: the handshake failed.
    """
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der(cert: Path) -> bytes:
    """The DER bytes of a PEM certificate file (its first certificate)."""
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def tls_get(
    port: int,
    ca: Path,
    client: tuple[Path, Path] | None,
    path: str = "/healthz",
    version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3,
) -> bytes:
    """GET ``path`` over TLS (certificate verified against ``ca``); the raw answer.

    Raises:
        ssl.SSLError: the handshake failed.
    """
    context = ssl.create_default_context(cafile=str(ca))
    context.minimum_version = context.maximum_version = version
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        tls = context.wrap_socket(raw, server_hostname="127.0.0.1")  # the handshake
        with tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            with contextlib.suppress(ssl.SSLError, ConnectionResetError):  # closed instead of answered
                while chunk := tls.recv(65536):
                    answer += chunk
            return answer
