"""The container images as built (``hack/image/build.sh``), run as pods on the real nodes.

Both archives are imported into each node's containerd (``ctr -n k8s.io images import``), then pods
name them as the chart does by default, with ``imagePullPolicy: IfNotPresent`` and no registry in
reach: an image under any other name would fail to pull. The gpuslice containers run under the
chart's container securityContext (``gpuslice.containerSecurity`` in
``charts/gpuslice/templates/_helpers.tpl``, read from there): uid/gid 65532, read-only root
filesystem, no capabilities, an emptyDir at ``/tmp`` (``HOME``). What is checked:

- the archives carry the chart's default references and the image config's user is 65532:65532;
- in the container: it is that user, ``/`` is mounted read-only and refuses writes, no pip (neither
  importable nor on PATH nor as a wheel ensurepip could install) and no compiler, and the package
  is precompiled; no development harness (``gpuslice_dev``, ``gpuslice/devcluster``) nor gRPC or
  Playwright; with only ``runAsNonRoot`` the image's own user is the one that runs;
- ``gpuslice --help`` and ``gpuslice <sub> --help`` for every subcommand the image's CLI lists
  (``simulate`` prints its one line about the sim extra and exits 2: the image is the server
  install);
- ``gpuslice webhook`` (TLS from a Secret, as the chart mounts it) and ``gpuslice agent --backend
  fake:t4-4`` become Ready through httpGet readiness probes on their health routes, and answer them
  at their pod IPs;
- the kube-scheduler image runs ``kube-scheduler`` from PATH as a non-root user, read-only.

``gpuslice serve`` needs an apiserver the pod can reach, which this tier does not provide; the
install tier runs it from the chart.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.sim import extra
from gpuslice_dev import imagearchive, images, realnode
from gpuslice_dev.paths import REPO_ROOT
from tests.node.conftest import NodeCluster

pytestmark = [pytest.mark.node, pytest.mark.timeout(600)]

CHART = REPO_ROOT / "charts" / "gpuslice"
WEBHOOK_PORT = 8443
AGENT_PORT = 9400
EROFS = 30
SERVER_COMMANDS = {"serve", "agent", "webhook", "render"}


def _container_security() -> dict[str, Any]:
    """The chart's container securityContext, read from its ``gpuslice.containerSecurity`` define."""
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    match = re.search(
        r'\{\{-? define "gpuslice\.containerSecurity" -?\}\}\n(.*?)\{\{-? end -?\}\}', text, re.S
    )
    assert match, "no gpuslice.containerSecurity in _helpers.tpl"
    security: dict[str, Any] = yaml.safe_load(match.group(1))
    assert security["readOnlyRootFilesystem"] is True, security
    assert (security["runAsUser"], security["runAsGroup"]) == (65532, 65532), security
    return security


POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
"""The pod-level securityContext of the chart's Deployments."""


@pytest.fixture(scope="module")
def built(node_cluster: NodeCluster) -> images.BuiltImages:
    """The images, imported into every node's containerd under their references."""
    result = images.built_images()
    for node in node_cluster.nodes.values():
        for image in result.all():
            node.import_image(image.archive, image.reference)
    return result


def _values(cluster: NodeCluster) -> tuple[str, str]:
    """The gpuslice and kube-scheduler image references the chart's defaults name here.

    An empty scheduler tag means the cluster's own version, as the chart reads it from the apiserver.
    """
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    app = f"{values['image']['repository']}:{values['image']['tag'] or chart['appVersion']}"
    sched = values["scheduler"]["image"]
    status, version = cluster.cp.api_request("GET", "/version")
    assert status == 200, version
    cluster_version = re.sub(r"[-+].*$", "", str(version["gitVersion"]))
    return app, f"{sched['repository']}:{sched['tag'] or cluster_version}"


def _pod(
    name: str,
    node: str,
    image: images.Image,
    command: list[str],
    *,
    security: dict[str, Any] | None = None,
    restart: str = "Never",
    **container: Any,
) -> dict[str, Any]:
    """A pod on ``node`` running ``command`` from ``image`` as the chart would, /tmp an emptyDir."""
    volumes = [{"name": "tmp", "emptyDir": {}}, *container.pop("volumes", [])]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, *container.pop("volumeMounts", [])]
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": restart,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1,
            "securityContext": POD_SECURITY,
            "volumes": volumes,
            "containers": [
                {
                    "name": "main",
                    "image": image.reference,
                    "imagePullPolicy": "IfNotPresent",
                    "command": command,
                    "securityContext": _container_security() if security is None else security,
                    "volumeMounts": mounts,
                    **container,
                }
            ],
        },
    }


def _finished_log(cluster: NodeCluster, ns: str, name: str, timeout: float = 180.0) -> str:
    """The log of a pod that ran to completion (``Succeeded``)."""

    def done() -> str:
        phase = cluster.phase(ns, name)
        if phase == "Failed":
            raise AssertionError(
                f"pod {ns}/{name} failed: {cluster.pod(ns, name)}\n{cluster.log(ns, name, 'main')}"
            )
        return phase if phase == "Succeeded" else ""

    cluster.wait(done, timeout, f"pod {ns}/{name} did not finish")
    return cluster.log(ns, name, "main")


def _wait_ready(cluster: NodeCluster, ns: str, name: str, timeout: float = 120.0) -> dict[str, Any]:
    """The pod once its Ready condition is True (its readiness probe passed)."""

    def ready() -> dict[str, Any] | None:
        pod = cluster.pod(ns, name)
        if pod is None:
            return None
        status = pod.get("status", {})
        if status.get("phase") == "Failed":
            raise AssertionError(f"pod {ns}/{name} failed: {status}")
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        return pod if conditions.get("Ready") == "True" else None

    pod: dict[str, Any] = cluster.wait(ready, timeout, f"pod {ns}/{name} not Ready")
    return pod


def _fetch(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_the_archives_carry_the_charts_default_references_and_user(
    cluster: NodeCluster, built: images.BuiltImages
) -> None:
    app, scheduler = _values(cluster)
    assert built.gpuslice.reference == app
    assert built.kube_scheduler.reference == scheduler
    for image in built.all():
        described = imagearchive.describe(image.archive)  # the archive itself, not only images.json
        assert described["reference"] == image.reference
        assert described["digest"] == image.digest
        assert described["layers"] == image.layers >= 1
        assert described["user"] == image.user
    assert built.gpuslice.user == "65532:65532"
    assert built.kube_scheduler.user == ""  # upstream's default (root); the chart sets 65532


def test_every_node_holds_both_images_under_their_references(
    cluster: NodeCluster, built: images.BuiltImages
) -> None:
    for name, node in cluster.nodes.items():
        proc = subprocess.run(
            ["ctr", "--address", str(node.containerd_socket), "--namespace", realnode.CONTAINERD_NAMESPACE]
            + ["images", "ls"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        rows = {line.split()[0]: line.split()[2] for line in proc.stdout.splitlines()[1:] if line.strip()}
        for image in built.all():
            assert rows.get(image.reference) == image.digest, (name, image.reference, proc.stdout)


MARK = "result: "
"""Prefix of the line a probe prints its JSON on (a log that is all JSON would reach us decoded)."""


def _marked_json(log: str) -> Any:
    lines = [line for line in log.splitlines() if line.startswith(MARK)]
    assert len(lines) == 1, log
    return json.loads(lines[0].removeprefix(MARK))


PROBE = r"""
import glob, json, os, shutil, subprocess, sysconfig
import gpuslice

def write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return 0
    except OSError as e:
        return e.errno

def run(*argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return [p.returncode, p.stderr[-400:]]

root_options = [line.split()[5] for line in open("/proc/self/mountinfo") if line.split()[4] == "/"]
found, walked = [], 0
for top in ("/usr", "/opt", "/etc"):
    for base, dirs, files in os.walk(top):
        walked += len(files)
        found += [os.path.join(base, d) for d in dirs if d == "pip" or d.startswith("pip-")]
        found += [os.path.join(base, f) for f in files if f.endswith(".whl")]
package = os.path.dirname(gpuslice.__file__)
uncompiled = [
    p for p in glob.glob(package + "/**/*.py", recursive=True)
    if not os.path.isfile(__import__("importlib.util").util.cache_from_source(p))
]
print(MARK + json.dumps({
    "ids": [os.getuid(), os.getgid()],
    "home": os.environ.get("HOME"),
    "root_options": root_options,
    "write": {p: write(p) for p in ("/probe", "/opt/gpuslice/probe", "/etc/probe", "/tmp/probe")},
    "which": {
        t: shutil.which(t) for t in ("pip", "pip3", "pip3.11", "gcc", "cc", "c++", "python", "gpuslice")
    },
    "import_pip": {py: run(py, "-c", "import pip") for py in ("python", "/usr/bin/python3")},
    "import_harness": {m: run("python", "-c", "import " + m) for m in ("gpuslice_dev", "grpc", "playwright")},
    "devcluster": os.path.exists(os.path.join(package, "devcluster")),
    "pip_files": found,
    "files_walked": walked,
    "stdlib": sysconfig.get_path("stdlib"),
    "uncompiled": uncompiled,
}))
"""


def test_the_image_runs_read_only_as_65532_without_pip_or_a_compiler(
    cluster: NodeCluster, ns: str, built: images.BuiltImages
) -> None:
    node = next(iter(cluster.nodes))
    cluster.create(ns, _pod("probe", node, built.gpuslice, ["python", "-c", f"MARK = {MARK!r}\n{PROBE}"]))
    # only runAsNonRoot: the kubelet accepts the image's own (numeric, non-root) user, which then runs
    own_user = {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False}
    cmd = ["python", "-c", "import os; print(os.getuid(), os.getgid())"]
    cluster.create(ns, _pod("own-user", node, built.gpuslice, cmd, security=own_user))
    facts = _marked_json(_finished_log(cluster, ns, "probe"))
    assert facts["ids"] == [65532, 65532]
    assert facts["home"] == "/tmp"
    assert facts["root_options"] and all("ro" in opts.split(",") for opts in facts["root_options"]), facts
    assert facts["write"] == {
        "/probe": EROFS,
        "/opt/gpuslice/probe": EROFS,
        "/etc/probe": EROFS,
        "/tmp/probe": 0,
    }
    which = facts["which"]
    assert which["python"] == "/opt/gpuslice/bin/python" and which["gpuslice"] == "/opt/gpuslice/bin/gpuslice"
    assert {tool: which[tool] for tool in ("pip", "pip3", "pip3.11", "gcc", "cc", "c++")} == dict.fromkeys(
        ("pip", "pip3", "pip3.11", "gcc", "cc", "c++")
    ), which
    for python, (code, stderr) in facts["import_pip"].items():
        assert code == 1 and "No module named 'pip'" in stderr, (python, code, stderr)
    assert facts["pip_files"] == [], facts["pip_files"]  # no pip package, no wheel ensurepip could use
    # the development harness (gpuslice-dev) and what only it needs are not in the server image
    for module, (code, stderr) in facts["import_harness"].items():
        assert code == 1 and f"No module named '{module}'" in stderr, (module, code, stderr)
    assert facts["devcluster"] is False
    assert facts["files_walked"] > 5000  # the search saw the image's files
    assert facts["uncompiled"] == []
    assert _finished_log(cluster, ns, "own-user").split() == ["65532", "65532"]


HELP = r"""
import json, subprocess
from gpuslice import cli
out = {}
for args in [[], *[[name] for name in cli.SUBCOMMANDS]]:
    p = subprocess.run(["gpuslice", *args, "--help"], capture_output=True, text=True, timeout=120)
    out[" ".join(args)] = [p.returncode, p.stdout[:3000], p.stderr[-500:]]
print(MARK + json.dumps(out))
"""


def test_every_subcommand_the_images_cli_lists_answers_help(
    cluster: NodeCluster, ns: str, built: images.BuiltImages
) -> None:
    node = list(cluster.nodes)[-1]
    cluster.create(ns, _pod("help", node, built.gpuslice, ["python", "-c", f"MARK = {MARK!r}\n{HELP}"]))
    results = _marked_json(_finished_log(cluster, ns, "help"))
    top = results.pop("")
    assert top[0] == 0 and top[1].startswith("usage: gpuslice"), top
    assert SERVER_COMMANDS <= set(results), sorted(results)
    failures = []
    for name, (code, stdout, stderr) in results.items():
        assert re.search(rf"^\s+{re.escape(name)}\b", top[1], re.M), f"{name} missing from gpuslice --help"
        if name == "simulate":  # the server install has no sim extra: one line, exit 2
            ok = code == extra.EXIT_MISSING and stderr == extra.message("gpuslice simulate") + "\n"
        else:
            ok = code == 0 and stdout.startswith(f"usage: gpuslice {name}")
        if not ok:
            failures.append(f"gpuslice {name} --help: exit {code}\n{stdout}\n{stderr}")
    assert not failures, "\n\n".join(failures)


def _self_signed(work: Path) -> tuple[str, str]:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-days", "1", "-subj", "/CN=gpuslice-webhook", "-addext", "subjectAltName=DNS:gpuslice-webhook"]
        + ["-keyout", str(work / "tls.key"), "-out", str(work / "tls.crt")],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return (work / "tls.crt").read_text(), (work / "tls.key").read_text()


UNREACHABLE_KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [
        {"name": "none", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}
    ],
    "users": [{"name": "none", "user": {"token": "unused"}}],
    "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
    "current-context": "none",
}
"""No apiserver is reachable from the pods here: the webhook's node informer never lists."""


def test_webhook_and_agent_answer_their_health_routes_read_only(
    cluster: NodeCluster, ns: str, built: images.BuiltImages, tmp_path: Path
) -> None:
    cert, key = _self_signed(tmp_path)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "webhook-files"},
        "type": "Opaque",
        "stringData": {"tls.crt": cert, "tls.key": key, "kubeconfig": json.dumps(UNREACHABLE_KUBECONFIG)},
    }
    status, body = cluster.cp.api_request("POST", f"/api/v1/namespaces/{ns}/secrets", secret)
    assert status == 201, body
    webhook_node, agent_node = list(cluster.nodes)[0], list(cluster.nodes)[-1]
    webhook = _pod(
        "webhook",
        webhook_node,
        built.gpuslice,
        ["gpuslice", "webhook", f"--listen=0.0.0.0:{WEBHOOK_PORT}", "--tls-cert=/etc/gpuslice/tls/tls.crt"]
        + ["--tls-key=/etc/gpuslice/tls/tls.key", "--kubeconfig=/etc/gpuslice/tls/kubeconfig"],
        restart="Always",
        volumes=[{"name": "files", "secret": {"secretName": "webhook-files"}}],
        volumeMounts=[{"name": "files", "mountPath": "/etc/gpuslice/tls", "readOnly": True}],
        ports=[{"name": "webhook", "containerPort": WEBHOOK_PORT}],
        readinessProbe={
            "httpGet": {"path": "/healthz", "port": WEBHOOK_PORT, "scheme": "HTTPS"},
            "periodSeconds": 1,
        },
    )
    agent = _pod(
        "agent",
        agent_node,
        built.gpuslice,
        ["gpuslice", "agent", "--backend=fake:t4-4", "--dry-run", f"--node-name={agent_node}"]
        + [f"--listen=0.0.0.0:{AGENT_PORT}"],
        restart="Always",
        ports=[{"name": "metrics", "containerPort": AGENT_PORT}],
        readinessProbe={"httpGet": {"path": "/healthz", "port": AGENT_PORT}, "periodSeconds": 1},
    )
    cluster.create(ns, webhook)
    cluster.create(ns, agent)

    ip = _wait_ready(cluster, ns, "webhook")["status"]["podIP"]
    tls = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
    tls.check_hostname = False  # the certificate names the service, not the pod IP; the chain is checked
    assert _fetch(f"https://{ip}:{WEBHOOK_PORT}/healthz", tls) == (200, "ok")
    # served by gpuslice's webhook: ready only once its node informer lists, which it cannot here
    assert _fetch(f"https://{ip}:{WEBHOOK_PORT}/readyz", tls) == (503, "node informer has not listed yet")

    ip = _wait_ready(cluster, ns, "agent")["status"]["podIP"]
    code, text = _fetch(f"http://{ip}:{AGENT_PORT}/healthz")
    assert code == 200 and f"node {agent_node}" in text and "backend fake NVML (t4-4" in text, (code, text)
    for name in ("webhook", "agent"):
        (state,) = cluster.pod(ns, name)["status"]["containerStatuses"]  # type: ignore[index]
        assert state["restartCount"] == 0 and "running" in state["state"], state


def test_the_kube_scheduler_image_runs_its_binary_from_path_as_non_root(
    cluster: NodeCluster, ns: str, built: images.BuiltImages
) -> None:
    node = list(cluster.nodes)[-1]
    cluster.create(ns, _pod("kube-scheduler", node, built.kube_scheduler, ["kube-scheduler", "--version"]))
    version = built.kube_scheduler.reference.rpartition(":")[2]
    assert _finished_log(cluster, ns, "kube-scheduler").strip() == f"Kubernetes {version}"
