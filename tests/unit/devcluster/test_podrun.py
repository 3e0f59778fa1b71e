"""podrun's pure parts: env and argv as the kubelet builds them, volume contents, mount plans."""

from __future__ import annotations

import base64
import posixpath
import shlex
from collections.abc import Collection, Mapping
from typing import Any

import pytest

from gpuslice_dev import podenv, podmounts, podrun, podvolumes
from gpuslice_dev.podenv import PodSpecError
from gpuslice_dev.podmounts import Bind, MountRequest, Overlay

pytestmark = pytest.mark.unit

POD = podenv.PodInfo(
    name="p-0",
    namespace="ns",
    uid="uid-1",
    node_name="node-a",
    service_account="sa",
    pod_ip="10.1.2.3",
    host_ip="192.0.2.1",
    labels={"app": "x", "tier": "web"},
    annotations={"note": 'say "hi"\n'},
)

CM = {
    "kind": "ConfigMap",
    "metadata": {"name": "cm"},
    "data": {"a.yaml": "a: 1\n", "B": "bee"},
    "binaryData": {"bin": base64.b64encode(b"\x00\x01").decode()},
}
SECRET = {
    "kind": "Secret",
    "metadata": {"name": "sec", "namespace": "ns"},
    "data": {"password": base64.b64encode(b"s3cret").decode(), "user": base64.b64encode(b"old").decode()},
    "stringData": {"user": "admin"},
}
OTHER_NS = {"kind": "Secret", "metadata": {"name": "only-elsewhere", "namespace": "other"}, "data": {}}
OBJECTS = podenv.ManifestObjects([CM, SECRET, OTHER_NS, None])
SERVICES = podenv.service_env("127.0.0.1", 6443)
ALLOC = {"cpu": "8", "memory": "16Gi", "pods": "110"}


def env_of(container: Mapping[str, Any], objects: podenv.Objects = OBJECTS) -> dict[str, str]:
    return podenv.container_env(
        container,
        pod=POD,
        objects=objects,
        all_containers=[container],
        services=SERVICES,
        node_allocatable=ALLOC,
    )


# ----------------------------------------------------------------- $(VAR) expansion


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "a"),
        ("x$(A)y$(A)", "xaya"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$a"),
        ("$$", "$"),
        ("$", "$"),
        ("a$", "a$"),
        ("$A", "$A"),
        ("$(A", "$(A"),
        ("$()", ""),
        ("$(EMPTY)", ""),
        ("no vars", "no vars"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert podenv.expand(text, {"A": "a", "EMPTY": "", "": ""}.get) == expected


def test_env_expands_only_earlier_variables_and_services() -> None:
    env = env_of(
        {
            "env": [
                {"name": "FIRST", "value": "1"},
                {"name": "BOTH", "value": "$(FIRST)-$(SECOND)-$(KUBERNETES_SERVICE_PORT)"},
                {"name": "SECOND", "value": "2"},
                {"name": "FIRST", "value": "one"},
                {"name": "ESCAPED", "value": "$$(FIRST)"},
                {"name": "FROM_FIELD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NOT_EXPANDED", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "B"}}},
            ]
        }
    )
    assert env["BOTH"] == "1-$(SECOND)-6443"
    assert env["FIRST"] == "one"
    assert env["ESCAPED"] == "$(FIRST)"
    assert env["FROM_FIELD"] == "p-0"
    assert env["NOT_EXPANDED"] == "bee"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_PORT_6443_TCP_ADDR"] == "127.0.0.1"


def test_env_overrides_service_variables_and_env_from() -> None:
    env = env_of(
        {
            "envFrom": [
                {"configMapRef": {"name": "cm"}, "prefix": "CM_"},
                {"secretRef": {"name": "sec"}},
                {"configMapRef": {"name": "absent", "optional": True}},
            ],
            "env": [
                {"name": "KUBERNETES_SERVICE_HOST", "value": "elsewhere"},
                {"name": "user", "value": "$(user)!"},
            ],
        }
    )
    assert env["CM_a.yaml"] == "a: 1\n"
    assert env["CM_B"] == "bee"
    assert env["CM_bin"] == "\x00\x01"
    assert env["password"] == "s3cret"
    assert env["user"] == "admin!"  # stringData wins over data; envFrom is visible to env
    assert env["KUBERNETES_SERVICE_HOST"] == "elsewhere"


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("metadata.name", "p-0"),
        ("metadata.namespace", "ns"),
        ("metadata.uid", "uid-1"),
        ("metadata.labels['app']", "x"),
        ("metadata.labels['absent']", ""),
        ("metadata.annotations['note']", 'say "hi"\n'),
        ("spec.nodeName", "node-a"),
        ("spec.serviceAccountName", "sa"),
        ("status.podIP", "10.1.2.3"),
        ("status.hostIP", "192.0.2.1"),
    ],
)
def test_field_ref_in_env(field: str, expected: str) -> None:
    assert env_of({"env": [{"name": "V", "valueFrom": {"fieldRef": {"fieldPath": field}}}]})["V"] == expected


def test_field_ref_limits_per_use() -> None:
    with pytest.raises(PodSpecError, match="not supported in an environment variable"):
        podenv.field_value(POD, "metadata.labels")
    with pytest.raises(PodSpecError, match="not supported in a downwardAPI volume"):
        podenv.field_value(POD, "spec.nodeName", volume=True)
    assert podenv.field_value(POD, "metadata.labels", volume=True) == 'app="x"\ntier="web"'
    assert podenv.field_value(POD, "metadata.annotations", volume=True) == 'note="say \\"hi\\"\\n"'


@pytest.mark.parametrize(
    ("resources", "resource", "divisor", "expected"),
    [
        ({"limits": {"cpu": "1500m"}}, "limits.cpu", None, "2"),
        ({"limits": {"cpu": "250m"}}, "limits.cpu", None, "1"),
        ({"limits": {"cpu": "250m"}}, "limits.cpu", "1m", "250"),
        ({"limits": {"cpu": "3"}}, "requests.cpu", None, "3"),  # request defaults to the limit
        ({}, "limits.cpu", None, "8"),  # unset limit: node allocatable
        ({}, "requests.cpu", None, "0"),
        ({"requests": {"cpu": "100m"}}, "requests.cpu", "1m", "100"),
        ({"limits": {"memory": "64Mi"}}, "limits.memory", None, str(64 * 2**20)),
        ({"limits": {"memory": "64Mi"}}, "limits.memory", "1Mi", "64"),
        ({"limits": {"memory": "1000"}}, "limits.memory", "1Ki", "1"),
        ({}, "limits.memory", "1Gi", "16"),
        ({"limits": {"hugepages-2Mi": "4Mi"}}, "requests.hugepages-2Mi", "2Mi", "2"),
    ],
)
def test_resource_field_ref(
    resources: dict[str, Any], resource: str, divisor: str | None, expected: str
) -> None:
    ref: dict[str, Any] = {"resource": resource}
    if divisor is not None:
        ref["divisor"] = divisor
    container = {
        "name": "c",
        "resources": resources,
        "env": [{"name": "V", "valueFrom": {"resourceFieldRef": ref}}],
    }
    assert env_of(container)["V"] == expected


def test_resource_field_ref_of_another_container() -> None:
    other = {"name": "other", "resources": {"limits": {"cpu": "2"}}}
    me = {
        "name": "me",
        "env": [
            {
                "name": "V",
                "valueFrom": {"resourceFieldRef": {"containerName": "other", "resource": "limits.cpu"}},
            }
        ],
    }
    env = podenv.container_env(
        me, pod=POD, objects=OBJECTS, all_containers=[me, other], services={}, node_allocatable=ALLOC
    )
    assert env["V"] == "2"
    with pytest.raises(PodSpecError, match="unsupported container resource"):
        podenv.resource_value(other, "limits.nvidia.com/gpu", None, ALLOC)


def test_key_refs_missing_and_optional() -> None:
    def ref(kind: str, name: str, key: str, optional: bool = False) -> dict[str, Any]:
        return {"env": [{"name": "V", "valueFrom": {kind: {"name": name, "key": key, "optional": optional}}}]}

    assert env_of(ref("secretKeyRef", "sec", "password"))["V"] == "s3cret"
    assert "V" not in env_of(ref("configMapKeyRef", "cm", "nope", optional=True))
    assert "V" not in env_of(ref("secretKeyRef", "absent", "k", optional=True))
    with pytest.raises(PodSpecError, match="couldn't find key nope in ConfigMap ns/cm"):
        env_of(ref("configMapKeyRef", "cm", "nope"))
    with pytest.raises(PodSpecError, match="Secret ns/only-elsewhere not found"):
        env_of(ref("secretKeyRef", "only-elsewhere", "k"))


def test_objects_fallback_is_asked_only_for_what_manifests_lack() -> None:
    asked: list[tuple[str, str, str]] = []

    def fallback(kind: str, ns: str, name: str) -> Mapping[str, Any] | None:
        asked.append((kind, ns, name))
        return {"data": {"k": "from-api"}} if name == "live" else None

    objects = podenv.ManifestObjects([CM], fallback)
    assert podenv.source_data(objects, "ConfigMap", "ns", "cm") == podenv.configmap_data(CM)
    assert podenv.source_data(objects, "ConfigMap", "ns", "live") == {"k": b"from-api"}
    assert podenv.source_data(objects, "Secret", "ns", "cm") is None
    assert asked == [("ConfigMap", "ns", "live"), ("Secret", "ns", "cm")]


def test_argv_expands_against_the_final_env() -> None:
    container = {
        "name": "c",
        "command": ["gpuslice", "serve"],
        "args": ["--port=$(PORT)", "$$(PORT)", "--x=$(UNSET)", "$(LATE)"],
    }
    assert podenv.container_argv(container, {"PORT": "8443", "LATE": "l"}) == [
        "gpuslice",
        "serve",
        "--port=8443",
        "$(PORT)",
        "--x=$(UNSET)",
        "l",
    ]
    with pytest.raises(PodSpecError, match="has no command"):
        podenv.container_argv({"name": "c", "args": ["x"]}, {})


# ----------------------------------------------------------------- volumes


def content(volume: dict[str, Any], **kwargs: Any) -> podvolumes.VolumeContent:
    return podvolumes.volume_content(volume, pod=POD, objects=OBJECTS, **kwargs)


def files_of(c: podvolumes.VolumeContent) -> dict[str, tuple[bytes, int]]:
    return {f.path: (f.data, f.mode) for f in c.files}


def test_config_map_volume_all_keys_and_items() -> None:
    whole = content({"name": "v", "configMap": {"name": "cm"}})
    assert whole.shape == "dir" and whole.read_only
    assert files_of(whole) == {
        "B": (b"bee", 0o644),
        "a.yaml": (b"a: 1\n", 0o644),
        "bin": (b"\x00\x01", 0o644),
    }
    picked = content(
        {
            "name": "v",
            "configMap": {
                "name": "cm",
                "defaultMode": 0o600,
                "items": [
                    {"key": "a.yaml", "path": "conf/app.yaml"},
                    {"key": "B", "path": "b", "mode": 0o755},
                ],
            },
        }
    )
    assert files_of(picked) == {"conf/app.yaml": (b"a: 1\n", 0o600), "b": (b"bee", 0o755)}


def test_config_map_volume_missing_and_optional() -> None:
    assert content({"name": "v", "configMap": {"name": "absent", "optional": True}}).files == ()
    with pytest.raises(PodSpecError, match="ConfigMap ns/absent not found"):
        content({"name": "v", "configMap": {"name": "absent"}})
    with pytest.raises(PodSpecError, match="has no key 'nope'"):
        content({"name": "v", "configMap": {"name": "cm", "items": [{"key": "nope", "path": "x"}]}})
    optional_item = {"name": "cm", "optional": True, "items": [{"key": "nope", "path": "x"}]}
    assert content({"name": "v", "configMap": optional_item}).files == ()


@pytest.mark.parametrize("path", ["../x", "/abs", "a/../../b", ""])
def test_item_paths_must_stay_inside(path: str) -> None:
    with pytest.raises(PodSpecError, match="must be relative"):
        content({"name": "v", "configMap": {"name": "cm", "items": [{"key": "B", "path": path}]}})


@pytest.mark.parametrize("mode", [0o1000, -1, "0644", True])
def test_bad_modes(mode: object) -> None:
    with pytest.raises(PodSpecError, match="mode"):
        content({"name": "v", "configMap": {"name": "cm", "defaultMode": mode}})


def test_secret_volume_decodes_base64_and_string_data() -> None:
    c = content({"name": "v", "secret": {"secretName": "sec", "defaultMode": 0o400}})
    assert files_of(c) == {"password": (b"s3cret", 0o400), "user": (b"admin", 0o400)}


def test_projected_volume_and_service_account_volume() -> None:
    minted: list[tuple[str | None, int]] = []

    def mint(audience: str | None, expiration: int) -> str:
        minted.append((audience, expiration))
        return f"token-{len(minted)}"

    root_ca = {"kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "PEM"}}
    objects = podenv.ManifestObjects([CM, SECRET, root_ca])
    sa = podvolumes.volume_content(
        podvolumes.service_account_volume("kube-api-access-x", 3600),
        pod=POD,
        objects=objects,
        mint_token=mint,
    )
    assert files_of(sa) == {
        "token": (b"token-1", 0o644),
        "ca.crt": (b"PEM", 0o644),
        "namespace": (b"ns", 0o644),
    }
    custom = {
        "name": "v",
        "projected": {
            "defaultMode": 0o440,
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": "vault",
                        "expirationSeconds": 7200,
                        "path": "vault/token",
                    }
                },
                {"secret": {"name": "sec", "items": [{"key": "password", "path": "pw", "mode": 0o400}]}},
                {"configMap": {"name": "absent", "optional": True}},
                {
                    "downwardAPI": {
                        "items": [
                            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                            {
                                "path": "mem",
                                "resourceFieldRef": {
                                    "containerName": "c",
                                    "resource": "limits.memory",
                                    "divisor": "1Mi",
                                },
                            },
                        ]
                    }
                },
            ],
        },
    }
    got = podvolumes.volume_content(
        custom,
        pod=POD,
        objects=objects,
        mint_token=mint,
        containers=[{"name": "c", "resources": {"limits": {"memory": "128Mi"}}}],
    )
    assert files_of(got) == {
        "vault/token": (b"token-2", 0o440),
        "pw": (b"s3cret", 0o400),
        "labels": (b'app="x"\ntier="web"', 0o440),
        "mem": (b"128", 0o440),
    }
    assert minted == [(None, 3600), ("vault", 7200)]
    dup = {
        "name": "v",
        "projected": {"sources": [{"configMap": {"name": "cm"}}, {"configMap": {"name": "cm"}}]},
    }
    with pytest.raises(PodSpecError, match="more than one file"):
        podvolumes.volume_content(dup, pod=POD, objects=objects)


def test_downward_api_volume_and_stand_ins() -> None:
    c = content(
        {
            "name": "v",
            "downwardAPI": {
                "items": [
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}, "mode": 0o600},
                ]
            },
        }
    )
    assert files_of(c) == {"name": (b"p-0", 0o644), "app": (b"x", 0o600)}
    empty = content({"name": "v", "emptyDir": {"medium": "Memory"}})
    assert (empty.shape, empty.files, empty.read_only) == ("dir", (), False)
    sock = content(
        {"name": "v", "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}}
    )
    assert sock.shape == "dir" and "stood in" in sock.note
    dev = content({"name": "v", "hostPath": {"path": "/dev/nvidiactl", "type": "CharDevice"}})
    assert dev.shape == "file"
    assert content({"name": "v", "hostPath": {"path": "/etc/x", "type": "FileOrCreate"}}).shape == "file"


@pytest.mark.parametrize(
    "volume",
    [
        {"name": "v", "persistentVolumeClaim": {"claimName": "c"}},
        {"name": "v", "csi": {"driver": "d"}},
        {"name": "v"},
        {"name": "v", "emptyDir": {}, "configMap": {"name": "cm"}},
        {"name": "v", "projected": {"sources": [{"clusterTrustBundle": {"name": "b", "path": "x"}}]}},
        {
            "name": "v",
            "projected": {"sources": [{"serviceAccountToken": {"path": "t", "expirationSeconds": 60}}]},
        },
    ],
)
def test_unsupported_volumes(volume: dict[str, Any]) -> None:
    with pytest.raises(PodSpecError):
        content(volume, mint_token=lambda aud, exp: "t")


def test_pod_template_of_workloads() -> None:
    template = {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}}
    for kind in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
        assert podrun.pod_template_of({"kind": kind, "spec": {"template": template}}) == template
    cron = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": template}}}}
    assert podrun.pod_template_of(cron) == template
    assert podrun.pod_template_of({"kind": "Pod", **template}) == template
    with pytest.raises(PodSpecError):
        podrun.pod_template_of({"kind": "Service", "spec": {}})


# ----------------------------------------------------------------- mount plans


class FakeFs:
    """A host file tree: directories, files and symlinks (absolute targets)."""

    def __init__(self, dirs: set[str], files: Collection[str] = (), links: Mapping[str, str] | None = None):
        self.dirs = dirs | {"/"}
        self.files = set(files)
        self.links = dict(links or {})

    def resolve(self, path: str) -> str:
        parts = [p for p in path.split("/") if p]
        out = "/"
        for i, part in enumerate(parts):
            out = posixpath.join(out, part)
            if out in self.links:
                return self.resolve(posixpath.join(self.links[out], *parts[i + 1 :]))
        return out

    def kind_of(self, path: str) -> podmounts.PathKind:
        path = self.resolve(path)
        return "dir" if path in self.dirs else "file" if path in self.files else "missing"


HOST = FakeFs(
    {
        "/etc",
        "/run",
        "/tmp",
        "/tmp/work",
        "/tmp/work/vol-a",
        "/tmp/work/vol-b",
        "/tmp/work/vol-b/sub",
        "/var",
        "/etc/ssl",
        "/dev",
    },
    {"/etc/hosts", "/tmp/work/vol-b/file.yaml", "/tmp/work/hostfile"},
    {"/var/run": "/run"},
)
MOUNT_POINTS = {"/", "/dev", "/dev/pts", "/dev/shm", "/etc/hosts", "/etc/ssl", "/proc"}


def plan(*requests: MountRequest, working_dir: str = "/", fs: FakeFs = HOST) -> podmounts.MountPlan:
    return podmounts.plan_mounts(
        requests, kind_of=fs.kind_of, resolve=fs.resolve, mount_points=MOUNT_POINTS, working_dir=working_dir
    )


def test_missing_mount_point_overlays_its_nearest_existing_ancestor() -> None:
    p = plan(
        MountRequest("/etc/app/conf", "/tmp/work/vol-a", read_only=True),
        MountRequest("/etc/other", "/tmp/work/vol-b"),
    )
    # One overlay on /etc; its submounts (a file and a directory) are bound back.
    assert p.overlays == (Overlay("/etc", ("/etc/hosts", "/etc/ssl")),)
    assert p.pins == (("/tmp/work/vol-b", False), ("/tmp/work/vol-a", False))
    assert p.binds == (
        Bind("/etc/other", 0, "", False, create=True, read_only=False),
        Bind("/etc/app/conf", 1, "", False, create=True, read_only=True),
    )


def test_symlinked_ancestors_are_resolved() -> None:
    p = plan(MountRequest(podvolumes.SERVICE_ACCOUNT_DIR, "/tmp/work/vol-a", read_only=True))
    assert p.overlays == (Overlay("/run"),)
    assert p.binds[0].target == "/run/secrets/kubernetes.io/serviceaccount"


def test_existing_mount_points_need_no_overlay() -> None:
    p = plan(
        MountRequest("/tmp", "/tmp/work/vol-a"),
        MountRequest("/etc/hosts", "/tmp/work/hostfile", is_file=True),
    )
    assert p.overlays == ()
    assert [(b.target, b.create, b.is_file) for b in p.binds] == [
        ("/tmp", False, False),
        ("/etc/hosts", False, True),
    ]


def test_overlays_do_not_cross_mount_points() -> None:
    p = plan(MountRequest("/etc/new", "/tmp/work/vol-a"), MountRequest("/etc/ssl/new", "/tmp/work/vol-b"))
    # /etc/ssl is its own mount: the overlay on /etc binds it back, so it needs its own overlay.
    assert p.overlays == (Overlay("/etc", ("/etc/hosts", "/etc/ssl")), Overlay("/etc/ssl"))
    q = plan(MountRequest("/dev/nvidia-caps/x", "/tmp/work/vol-a"))
    assert q.overlays == (Overlay("/dev", ("/dev/pts", "/dev/shm")),)


def test_sub_path_and_nested_mounts() -> None:
    p = plan(
        MountRequest("/etc/app/config.yaml", "/tmp/work/vol-b", sub_path="file.yaml", is_file=True),
        MountRequest("/etc/app", "/tmp/work/vol-a"),
        MountRequest("/etc/app/sub/dir", "/tmp/work/vol-b", sub_path="sub"),
    )
    # Sorted by depth; /etc/app is made in the overlay, the rest inside the vol-a mount.
    assert p.overlays == (Overlay("/etc", ("/etc/hosts", "/etc/ssl")),)
    assert p.binds == (
        Bind("/etc/app", 0, "", False, create=True, read_only=False),
        Bind("/etc/app/config.yaml", 1, "file.yaml", True, create=True, read_only=False),
        Bind("/etc/app/sub/dir", 1, "sub", False, create=True, read_only=False),
    )


def test_nested_mount_point_that_exists_in_the_outer_volume() -> None:
    p = plan(MountRequest("/etc/app", "/tmp/work/vol-b"), MountRequest("/etc/app/sub", "/tmp/work/vol-a"))
    assert [(b.target, b.create) for b in p.binds] == [("/etc/app", True), ("/etc/app/sub", False)]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (MountRequest("/newtop/x", "/tmp/work/vol-a"), "nearest existing ancestor is /"),
        (MountRequest("relative", "/tmp/work/vol-a"), "must be absolute"),
        (MountRequest("/etc/hosts", "/tmp/work/vol-a"), "exists and is not a directory"),
        (MountRequest("/etc", "/tmp/work/hostfile", is_file=True), "exists and is not a file"),
        (MountRequest("/etc/hosts/x", "/tmp/work/vol-a"), "/etc/hosts is not a directory"),
    ],
)
def test_mount_plan_errors(request_: MountRequest, message: str) -> None:
    with pytest.raises(PodSpecError, match=message):
        plan(request_)


def test_working_dir_is_created_like_a_mount_point() -> None:
    assert plan(working_dir="/tmp").make_dirs == ()
    p = plan(working_dir="/etc/app/work")
    assert (p.overlays, p.make_dirs) == ((Overlay("/etc", ("/etc/hosts", "/etc/ssl")),), ("/etc/app/work",))
    inside = plan(MountRequest("/etc/app", "/tmp/work/vol-b"), working_dir="/etc/app/sub")
    assert inside.make_dirs == ()
    with pytest.raises(PodSpecError, match="nearest existing ancestor is /"):
        plan(working_dir="/app")


def test_script_pins_overlays_binds_then_remounts_read_only() -> None:
    p = plan(
        MountRequest("/etc/app conf", "/tmp/work/vol-a", read_only=True),
        MountRequest("/etc/app conf/x.yaml", "/tmp/work/vol-b", sub_path="file.yaml", is_file=True),
    )
    tools = {name: f"/bin/{name}" for name in ("mount", "mkdir", "touch", "env", "hostname")}
    script = podmounts.render_script(
        p,
        scratch="/tmp/work/ns/c",
        tools=tools,
        working_dir="/",
        env={"A": "it's", "CONF_a.yaml": "x"},
        hostname="p-0",
    )
    lines = script.splitlines()
    assert lines[:4] == [
        "set -eu",
        "/bin/hostname p-0",
        "/bin/mount -t tmpfs -o mode=0700 gpuslice-podrun /tmp/work/ns/c",
        "cd /tmp/work/ns/c",
    ]
    overlay = "/bin/mount -t overlay overlay -o lowerdir=o0/l,upperdir=o0/u,workdir=o0/w /etc"
    order = [
        "/bin/mount --bind /tmp/work/vol-a p0",
        "/bin/mount --bind /tmp/work/vol-b p1",
        "/bin/mount --rbind /etc o0/l",
        overlay,
        "/bin/mount --rbind o0/l/hosts /etc/hosts",
        "/bin/mkdir -p '/etc/app conf'",
        "/bin/mount --bind p0 '/etc/app conf'",
        "/bin/touch '/etc/app conf/x.yaml'",
        "/bin/mount --bind p1/file.yaml '/etc/app conf/x.yaml'",
        "/bin/mount -o remount,bind,ro '/etc/app conf'",
        "cd /",
        "printf ok >&0",
    ]
    assert [lines.index(line) for line in order] == sorted(lines.index(line) for line in order)
    last = shlex.split(lines[-1])
    assert last == ["exec", "/bin/env", "-i", "--", "A=it's", "CONF_a.yaml=x", "$0", "$@", "</dev/null"]


def test_a_kept_host_directory_hidden_by_a_volume_is_bound_back() -> None:
    """An emptyDir on /tmp must not hide a checkout under /tmp that the container's program runs from."""
    kept = podmounts.plan_mounts(
        [MountRequest("/tmp", "/tmp/work/vol-a")],
        kind_of=HOST.kind_of,
        resolve=HOST.resolve,
        mount_points=MOUNT_POINTS,
        keep=["/tmp/work", "/usr", "/tmp"],
    )
    # /usr is not under a volume and /tmp is the mount point itself: only /tmp/work comes back.
    assert kept.pins == (("/tmp/work/vol-a", False), ("/tmp/work", False))
    assert kept.binds[-1] == podmounts.Bind("/tmp/work", 1, "", False, True, False)
    script = podmounts.render_script(
        kept,
        scratch="/s",
        tools={"mount": "mount", "mkdir": "mkdir", "touch": "touch", "env": "env"},
        working_dir="/",
        env={},
    )
    assert (
        script.index("mount --bind p0 /tmp")
        < script.index("mkdir -p /tmp/work")
        < script.index("mount --bind p1 /tmp/work")
    )
