"""Device plugins for the real test nodes: what a plugin command is told, and its credentials.

A node's device plugin is a command (``PluginCommand``): gpuslice's own
(``gpuslice_dev.deviceplugin``, ``gpuslice_plugin``), or any other executable
(``external_plugin``), HAMi's own among them (``docs/real-nodes.md``). ``devcluster.realnode``
starts it in the node's mount namespace, where ``/var/lib/kubelet/device-plugins`` is the node's
own, with ``NODE_NAME`` and ``KUBECONFIG`` set. The kubeconfig is a client certificate for the user
``gpuslice:device-plugin:<node>``, bound to a ClusterRole with what a HAMi-style plugin needs
(nodes and pods: read and patch; events: create): never an admin token.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from gpuslice_dev.controlplane import ControlPlane, ControlPlaneError

PLUGIN_USER = "gpuslice:device-plugin:{node}"
PLUGIN_ROLE = "gpuslice-device-plugin"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


class PluginSetupError(RuntimeError):
    """The plugin's credentials or RBAC could not be made."""


class PluginContext(msgspec.Struct, frozen=True):
    """What a device-plugin command is told about the node it serves.

    Attributes:
        node: Node name.
        kubeconfig: The plugin's own credentials.
        socket_dir: kubelet's device-plugin directory as the plugin sees it.
        dev_dir: Placeholder device nodes (``nvidia<i>``, ``nvidiactl``, ``nvidia-uvm``).
        hami_dir: Placeholder HAMi-core files: ``libvgpu.so``, ``ld.so.preload``, ``containers/``
            (per-container shared caches), ``vgpulock/``.
        work_dir: The node's directory.
        cards: How many cards the node's NVML reports.
        nvml_dir: Directory holding the ``libnvidia-ml.so.1`` the plugin should load (the fake
            library), empty for a plugin that needs none.
        nvml_shape: The fake library's machine file (``GPUSLICE_FAKE_NVML_SHAPE``).
    """

    node: str
    kubeconfig: Path
    socket_dir: Path
    dev_dir: Path
    hami_dir: Path
    work_dir: Path
    cards: int
    nvml_dir: Path | None = None
    nvml_shape: Path | None = None

    def nvml_env(self) -> dict[str, str]:
        """The environment that makes a process load the node's NVML library."""
        if self.nvml_dir is None or self.nvml_shape is None:
            return {}
        search = [str(self.nvml_dir), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":"))]
        return {"LD_LIBRARY_PATH": ":".join(search), "GPUSLICE_FAKE_NVML_SHAPE": str(self.nvml_shape)}


PluginCommand = Callable[[PluginContext], tuple[list[str], dict[str, str]]]
"""Argv and extra environment of a device plugin for a node (module docstring)."""


def gpuslice_plugin(backend: str, split_count: int = 10, extra_args: Sequence[str] = ()) -> PluginCommand:
    """The gpuslice device plugin with cards from ``backend`` (``fake:<shape>`` or ``nvml``)."""

    def command(ctx: PluginContext) -> tuple[list[str], dict[str, str]]:
        argv = [
            sys.executable, "-m", "gpuslice_dev.deviceplugin",
            "--node-name", ctx.node, "--kubeconfig", str(ctx.kubeconfig),
            "--socket-dir", str(ctx.socket_dir), "--backend", backend,
            "--split-count", str(split_count),
            "--hami-dir", str(ctx.hami_dir), "--dev-dir", str(ctx.dev_dir),
            "--lock-dir", str(ctx.hami_dir / "vgpulock"), *extra_args,
        ]  # fmt: skip
        return argv, ctx.nvml_env()

    return command


def external_plugin(executable: Path) -> PluginCommand:
    """Any other device plugin, HAMi's among them, started as ``executable`` with no arguments.

    It is told the node through the environment (``docs/real-nodes.md`` shows a wrapper for
    HAMi's plugin): ``NODE_NAME``, ``KUBECONFIG``, ``GPUSLICE_NODE_DIR``, ``GPUSLICE_DEV_DIR``,
    ``GPUSLICE_HAMI_DIR``, ``GPUSLICE_SOCKET_DIR``, ``GPUSLICE_CARDS``, and, for an NVML-based
    plugin, ``LD_LIBRARY_PATH`` and ``GPUSLICE_FAKE_NVML_SHAPE`` naming the fake NVML library and
    its machine.
    """

    def command(ctx: PluginContext) -> tuple[list[str], dict[str, str]]:
        env = {
            "GPUSLICE_NODE_DIR": str(ctx.work_dir),
            "GPUSLICE_DEV_DIR": str(ctx.dev_dir),
            "GPUSLICE_HAMI_DIR": str(ctx.hami_dir),
            "GPUSLICE_SOCKET_DIR": str(ctx.socket_dir),
            "GPUSLICE_CARDS": str(ctx.cards),
            **ctx.nvml_env(),
        }
        return [str(executable)], env

    return command


def credentials(plane: ControlPlane, node: str) -> Path:
    """The plugin's kubeconfig for ``node``: its own certificate, bound to ``PLUGIN_ROLE``."""
    user = PLUGIN_USER.format(node=node)
    try:
        kubeconfig = plane.client_kubeconfig(user)
    except ControlPlaneError as exc:
        raise PluginSetupError(f"cannot make the device plugin's certificate: {exc}") from exc
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": PLUGIN_ROLE},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "update", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "update", "patch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{PLUGIN_ROLE}-{node}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PLUGIN_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    for kind, body in (("clusterroles", role), ("clusterrolebindings", binding)):
        status, answer = plane.api_request("POST", f"{RBAC}/{kind}", body)
        if status not in (201, 409):
            raise PluginSetupError(f"cannot create the device plugin's {kind}: {status} {answer}")
    return kubeconfig
