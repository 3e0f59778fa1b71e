"""The local cluster's credentials: a CA for client certificates, and kubeconfig files.

Kubernetes reads a client certificate's CN as the user and each O as a group
(https://kubernetes.io/docs/reference/access-authn-authz/authentication/#x509-client-certificates),
so a kubelet gets ``CN=system:node:<name>, O=system:nodes`` and the Node authorizer confines it to
its own node. Keys are EC P-256 made with ``openssl``; certificates live two days (the clusters
these serve live minutes).

Kubeconfigs are written as JSON, which is YAML (every reader of kubeconfigs parses it), so no
value needs quoting by hand.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path


class PkiError(RuntimeError):
    """``openssl`` is missing or refused a step; the message names the command and its error."""


def _openssl(*args: str) -> None:
    if shutil.which("openssl") is None:
        raise PkiError("openssl is required for the local cluster's keys and certificates")
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)  # noqa: S603, S607
    if proc.returncode != 0:
        raise PkiError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def rsa_key_pair(key: Path, public: Path) -> None:
    """An RSA-2048 key and its public half (kube-apiserver's service-account signing keys)."""
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("rsa", "-in", str(key), "-pubout", "-out", str(public))


class ClientCA:
    """A CA that signs client certificates, kept in ``directory`` (``ca.crt``, ``ca.key``).

    ``sign`` may be called from several threads: the CA's serial file is rewritten by every
    signature, so signatures take turns.
    """

    def __init__(self, directory: Path, name: str = "gpuslice-test-ca") -> None:
        self.directory = directory
        self.cert = directory / "ca.crt"
        self.key = directory / "ca.key"
        self._lock = threading.Lock()
        if not self.cert.exists():
            directory.mkdir(parents=True, exist_ok=True)
            _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(self.key))
            _openssl(
                "req", "-x509", "-new", "-key", str(self.key), "-out", str(self.cert),
                "-days", "2", "-subj", f"/CN={name}",
            )  # fmt: skip

    def sign(self, stem: str, user: str, groups: Sequence[str] = ()) -> tuple[Path, Path]:
        """A key and a certificate for ``user`` in ``groups``: ``<stem>.crt``, ``<stem>.key``."""
        key, csr, crt = (self.directory / f"{stem}{ext}" for ext in (".key", ".csr", ".crt"))
        subject = "".join(f"/O={group}" for group in groups) + f"/CN={user}"
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
        _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", subject)
        with self._lock:
            _openssl(
                "x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
                "-CAcreateserial", "-out", str(crt), "-days", "2",
            )  # fmt: skip
        csr.unlink()
        return crt, key


def kubeconfig(
    server: str,
    user: str,
    *,
    token: str | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> str:
    """A kubeconfig for ``server`` (TLS verification skipped) with a token or a client certificate."""
    if (token is None) == (cert is None or key is None):
        raise ValueError("a kubeconfig needs either a token or a client certificate and key")
    credentials: dict[str, str] = (
        {"token": token} if token is not None else {"client-certificate": str(cert), "client-key": str(key)}
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    return json.dumps(config, indent=2) + "\n"
