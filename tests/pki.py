"""A throwaway PKI made with ``openssl``: a CA, a server certificate for 127.0.0.1/localhost, a
client certificate signed by the CA, and a client certificate signed by another CA (a stranger)."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import socket
import ssl
import subprocess
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


def _signed(name: str, ca: str, cn: str, ext: str, cwd: Path) -> None:
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
    _openssl(*args, "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=cwd)


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
