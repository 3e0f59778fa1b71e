"""``gpuslice webhook`` behind a real kube-apiserver: registered, called over HTTPS, and stopped.

A CA and a serving certificate (SAN IP 127.0.0.1) are made with openssl; the webhook runs as a
child process with the admin kubeconfig; a Mutating- and a ValidatingWebhookConfiguration point
at it by URL with the CA bundle. Both configurations match only namespaces carrying a label
unique to this test, so other tests sharing the apiserver never reach the webhook, and both are
deleted at the end.

The helpers here (``make_certs``, ``WebhookProcess``, ``register``, ``wait_until``) are reused by
``tests/e2e/test_webhook_scheduling.py``.
"""

from __future__ import annotations

import base64
import json
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest

from gpuslice.codec import keys, registrations, resources
from gpuslice.model import requests
from gpuslice_dev import devcluster, nodesim
from gpuslice_dev.controlplane import ControlPlane
from tests.integration import kubehelpers as h

pytestmark = pytest.mark.integration

GPU, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)
SCHEDULER = "gpuslice-scheduler"
WAIT_S = 30.0
T = TypeVar("T")


# ----------------------------------------------------------------------------- helpers


def make_certs(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a serving certificate for 127.0.0.1 signed by it: (ca.crt, tls.crt, tls.key)."""
    ca_key, ca_crt = directory / "ca.key", directory / "ca.crt"
    key, csr, crt, ext = (
        directory / "tls.key",
        directory / "tls.csr",
        directory / "tls.crt",
        directory / "ext.cnf",
    )

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)  # noqa: S603, S607

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=gpuslice-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(ca_key), "-out", str(ca_crt),
    )  # fmt: skip
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    ext.write_text(
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "1", "-sha256", "-extfile", str(ext), "-out", str(crt),
    )  # fmt: skip
    return ca_crt, crt, key


class WebhookProcess:
    """A ``gpuslice webhook`` child process on a free loopback port, stopped by its own pid."""

    def __init__(
        self,
        kubeconfig: Path,
        ca: Path,
        cert: Path,
        key: Path,
        log_path: Path,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.port = devcluster.free_port()
        self.ca = ca
        self.log_path = log_path
        self.argv = devcluster.gpuslice_command(
            "webhook",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--kubeconfig",
            str(kubeconfig),
            "-v",
            "4",
            *extra_args,
        )
        self.popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, str]:
        """GET over HTTPS, verifying the server against the test CA; (0, error) when unreachable."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        try:
            with urllib.request.urlopen(self.url + path, context=ctx, timeout=5) as resp:  # noqa: S310
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read().decode()
        except (urllib.error.URLError, OSError) as err:
            return 0, str(err)

    def start(self) -> WebhookProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(  # noqa: S603 - our own CLI
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise AssertionError(f"gpuslice webhook exited with {self.popen.returncode}:\n{self.tail()}")
            if self.get("/readyz")[0] == 200:
                return self
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"gpuslice webhook not ready after {WAIT_S:.0f} s:\n{self.tail()}")

    def stop(self) -> None:
        popen, self.popen = self.popen, None
        if popen is not None and popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(10)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def webhook_config(
    kind: str, name: str, url: str, ca: Path, label: tuple[str, str], failure_policy: str
) -> dict[str, Any]:
    """A Mutating- or ValidatingWebhookConfiguration for pods CREATE in namespaces with ``label``."""
    hook: dict[str, Any] = {
        "name": f"{'mutate' if kind.startswith('Mutating') else 'validate'}.gpuslice.io",
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca.read_bytes()).decode()},
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "namespaceSelector": {"matchLabels": {label[0]: label[1]}},
        "objectSelector": {
            "matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]
        },
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "timeoutSeconds": 5,
    }
    if kind.startswith("Mutating"):
        hook["reinvocationPolicy"] = "Never"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [hook],
    }


def _collection(kind: str) -> str:
    return f"/apis/admissionregistration.k8s.io/v1/{kind.lower()}s"


class Registration:
    """Both webhook configurations of one test, scoped to namespaces labelled ``label``."""

    KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")

    def __init__(self, cp: ControlPlane, hook: WebhookProcess, failure_policy: str = "Fail") -> None:
        self.cp = cp
        self.name = f"gpuslice-test-{uuid.uuid4().hex[:8]}"
        self.label = ("gpuslice.io/webhook-test", self.name)
        for kind in self.KINDS:
            path = "/webhook" if kind.startswith("Mutating") else "/validate"
            body = webhook_config(kind, self.name, hook.url + path, hook.ca, self.label, failure_policy)
            status, obj = cp.api_request("POST", _collection(kind), body)
            assert status == 201, obj

    def namespace(self, prefix: str = "wh") -> str:
        """A fresh namespace the webhooks apply to."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": dict([self.label])},
        }
        status, obj = self.cp.api_request("POST", "/api/v1/namespaces", body)
        assert status == 201, obj
        return name

    def set_failure_policy(self, policy: str) -> None:
        for kind in self.KINDS:
            status, obj = self.cp.api_request("GET", f"{_collection(kind)}/{self.name}")
            assert status == 200, obj
            obj["webhooks"][0]["failurePolicy"] = policy
            status, obj = self.cp.api_request("PUT", f"{_collection(kind)}/{self.name}", obj)
            assert status == 200, obj

    def delete(self) -> None:
        for kind in self.KINDS:
            self.cp.api_request("DELETE", f"{_collection(kind)}/{self.name}")


def register(cp: ControlPlane, hook: WebhookProcess, failure_policy: str = "Fail") -> Registration:
    return Registration(cp, hook, failure_policy)


def wait_until(what: Callable[[], T | None], message: str, timeout: float = WAIT_S) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s: {message}")
        time.sleep(0.2)


def pod_body(
    name: str,
    limits: dict[str, str] | None = None,
    *,
    container: str = "main",
    scheduler: str | None = None,
    labels: dict[str, str] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": container,
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": dict(limits)} if limits else {},
            }
        ]
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node_name is not None:
        spec["nodeName"] = node_name
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def create(
    cp: ControlPlane, ns: str, body: dict[str, Any], dry_run: bool = False
) -> tuple[int, dict[str, Any]]:
    query = "?dryRun=All" if dry_run else ""
    return cp.api_request("POST", f"/api/v1/namespaces/{ns}/pods{query}", body)


def wait_webhook_active(cp: ControlPlane, ns: str) -> None:
    """Wait until the apiserver calls the new webhook (its configuration informer is asynchronous)."""

    def mutated() -> bool:
        status, obj = create(cp, ns, pod_body(f"probe-{uuid.uuid4().hex[:6]}", {GPU: "1"}), dry_run=True)
        return status == 201 and obj["spec"].get("schedulerName") == SCHEDULER

    wait_until(mutated, "the mutating webhook is never called")


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def certs(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_certs(tmp_path)


@pytest.fixture
def webhook(
    control_plane: ControlPlane, certs: tuple[Path, Path, Path], tmp_path: Path
) -> Iterator[WebhookProcess]:
    ca, crt, key = certs
    process = WebhookProcess(control_plane.kubeconfig, ca, crt, key, tmp_path / "webhook.log").start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def registered(control_plane: ControlPlane, webhook: WebhookProcess) -> Iterator[Registration]:
    reg = register(control_plane, webhook)
    try:
        yield reg
    finally:
        reg.delete()


# ----------------------------------------------------------------------------- tests


def _request(pod: dict[str, Any]) -> tuple[requests.ContainerRequest | None, ...]:
    return resources.parse_pod(pod).containers


def test_mutates_validates_and_leaves_other_pods_alone(
    control_plane: ControlPlane, webhook: WebhookProcess, registered: Registration, node_name: str
) -> None:
    cp = control_plane
    ns = registered.namespace()
    wait_webhook_active(cp, ns)

    # A GPU pod without schedulerName: gets ours, and HAMi's defaults in limits and requests.
    status, pod = create(cp, ns, pod_body("share", {MEM: "3000"}))
    assert status == 201, pod
    assert pod["spec"]["schedulerName"] == SCHEDULER
    res = pod["spec"]["containers"][0]["resources"]
    assert res["limits"][GPU] == "1" and res["requests"][GPU] == "1"
    assert res["limits"] == res["requests"]
    assert CORES not in res["limits"]
    assert _request(pod) == _request(pod_body("share", {MEM: "3000"})) != _request(pod_body("x", {GPU: "1"}))

    # A bare card becomes an exclusive card.
    status, pod = create(cp, ns, pod_body("whole", {GPU: "1"}, scheduler="default-scheduler"))
    assert status == 201, pod
    assert pod["spec"]["schedulerName"] == SCHEDULER
    res = pod["spec"]["containers"][0]["resources"]
    assert (res["limits"][CORES], res["requests"][CORES]) == ("100", "100")

    # Out of range: refused at create time with our message, naming container and field.
    status, body = create(cp, ns, pod_body("bad", {GPU: "1", PCT: "150"}, container="train"))
    assert status in (400, 403), body
    message = body.get("message", "")
    assert 'container "train"' in message and "nvidia.com/gpumem-percentage" in message, body
    assert "must be in 1..100, got 150" in message
    assert create(cp, ns, pod_body("bad", {GPU: "1"}), dry_run=True)[0] == 201  # the name is free

    # A preset node is refused like HAMi does.
    status, body = create(cp, ns, pod_body("pinned", {GPU: "1"}, node_name="somewhere"))
    assert status in (400, 403) and "pod has node assigned" in body.get("message", ""), body

    # Not a GPU pod, another scheduler, or opted out: untouched.
    status, pod = create(cp, ns, pod_body("cpu", {"cpu": "1"}))
    assert status == 201, pod
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1"}
    status, pod = create(cp, ns, pod_body("other", {MEM: "10"}, scheduler="volcano"))
    assert status == 201, pod
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {MEM: "10"}
    status, pod = create(cp, ns, pod_body("optout", {GPU: "1"}, labels={"hami.io/webhook": "ignore"}))
    assert status == 201, pod
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert CORES not in pod["spec"]["containers"][0]["resources"]["limits"]

    # Capacity: once a GPU node is registered, a count no node has is refused.
    cards = nodesim.cards(node_name, count=2)
    h.create_node(cp, node_name, annotations={keys.NODE_REGISTER: registrations.encode_json(cards)})

    def refused() -> dict[str, Any] | None:
        status, body = create(cp, ns, pod_body("huge", {GPU: "4096"}, container="big"), dry_run=True)
        return body if status in (400, 403) else None

    body = wait_until(refused, "a 4096-card pod is never refused")
    assert 'container "big": nvidia.com/gpu is 4096, more cards than any node registers' in body["message"]
    status, text = webhook.get("/metrics")
    assert status == 200
    assert 'gpuslice_webhook_requests_total{operation="validate",result="denied"}' in text
    assert 'gpuslice_webhook_requests_total{operation="mutate",result="patched"}' in text


def test_failure_policy_when_the_webhook_is_down(
    control_plane: ControlPlane, webhook: WebhookProcess, registered: Registration
) -> None:
    cp = control_plane
    ns = registered.namespace()
    wait_webhook_active(cp, ns)
    webhook.stop()

    # failurePolicy Fail: GPU pods cannot be created while the webhook is down (every pod in the
    # matched namespaces goes to the webhook: the apiserver cannot tell GPU pods apart itself).
    status, body = create(cp, ns, pod_body("blocked", {GPU: "1"}))
    assert status >= 400, body
    assert 'failed calling webhook "mutate.gpuslice.io"' in body.get("message", ""), body
    assert create(cp, ns, pod_body("blocked", {GPU: "1"}), dry_run=True)[0] >= 400

    # failurePolicy Ignore: the pod goes through, unmutated.
    registered.set_failure_policy("Ignore")
    wait_until(
        lambda: create(cp, ns, pod_body("probe", {GPU: "1"}), dry_run=True)[0] == 201,
        "failurePolicy Ignore never lets a pod through",
    )
    status, pod = create(cp, ns, pod_body("through", {GPU: "1"}))
    assert status == 201, pod
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert CORES not in pod["spec"]["containers"][0]["resources"]["limits"]


def test_exits_2_on_invalid_settings(control_plane: ControlPlane) -> None:
    out = subprocess.run(  # noqa: S603 - our own CLI
        devcluster.gpuslice_command(
            "webhook", "--kubeconfig", str(control_plane.kubeconfig), "--tls-cert", "x"
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "tls_cert and tls_key" in out.stderr


def test_review_payload_shape_matches_the_apiserver(webhook: WebhookProcess) -> None:
    # A v1beta1 review, as HAMi's chart registers, is answered in v1beta1.
    body = {
        "apiVersion": "admission.k8s.io/v1beta1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "object": pod_body("p", {GPU: "1"}),
        },
    }
    ctx = ssl.create_default_context(cafile=str(webhook.ca))
    req = urllib.request.Request(
        webhook.url + "/webhook", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:  # noqa: S310
        answer = json.load(resp)
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    assert answer["response"]["uid"] == "u" and answer["response"]["patchType"] == "JSONPatch"


VGPU, VMEM, VPCT, VCORES = (
    "example.com/vgpu",
    "example.com/vmem",
    "example.com/vmem-pct",
    "example.com/vcores",
)
RENAMED_ARGS = (
    "--resource-count-name",
    VGPU,
    "--resource-memory-name",
    VMEM,
    "--resource-memory-percentage-name",
    VPCT,
    "--resource-core-name",
    VCORES,
)


def test_renamed_resources(
    control_plane: ControlPlane, certs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    cp = control_plane
    ca, crt, key = certs
    hook = WebhookProcess(
        cp.kubeconfig, ca, crt, key, tmp_path / "renamed.log", extra_args=RENAMED_ARGS
    ).start()
    reg = register(cp, hook)
    try:
        ns = reg.namespace()

        def mutated() -> bool:
            status, obj = create(cp, ns, pod_body(f"probe-{uuid.uuid4().hex[:6]}", {VGPU: "1"}), dry_run=True)
            return status == 201 and obj["spec"].get("schedulerName") == SCHEDULER

        wait_until(mutated, "the renamed webhook is never called")

        # The defaults go under the configured names.
        status, pod = create(cp, ns, pod_body("share", {VMEM: "3000"}))
        assert status == 201, pod
        res = pod["spec"]["containers"][0]["resources"]
        assert res["limits"] == res["requests"] == {VMEM: "3k", VGPU: "1"}  # the apiserver's canonical 3000
        status, pod = create(cp, ns, pod_body("whole", {VGPU: "1"}))
        assert status == 201, pod
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {VGPU: "1", VCORES: "100"}

        # Validation too, named by the configured resource.
        status, body = create(cp, ns, pod_body("bad", {VGPU: "1", VPCT: "150"}, container="train"))
        assert status == 400, body
        assert f'container "train": {VPCT} must be in 1..100, got 150' in body.get("message", ""), body

        # The default names are ordinary extended resources now: not a GPU pod.
        status, pod = create(cp, ns, pod_body("old", {GPU: "1"}))
        assert status == 201, pod
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}
    finally:
        reg.delete()
        hook.stop()


def test_bad_resource_name_exits_2(control_plane: ControlPlane) -> None:
    out = subprocess.run(  # noqa: S603 - our own CLI
        devcluster.gpuslice_command(
            "webhook", "--kubeconfig", str(control_plane.kubeconfig), "--resource-core-name", GPU
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "resource_count_name and resource_core_name must differ" in out.stderr
