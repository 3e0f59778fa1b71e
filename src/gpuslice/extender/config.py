"""Settings of ``gpuslice serve``: defaults < YAML file < ``GPUSLICE_*`` environment < flags.

Settings are read once at startup into a frozen ``Settings``; anything invalid raises
``ConfigError`` with a message naming the setting, and the command exits with status 2.

Every ``*_s`` setting takes seconds (``15``, ``2.5``) or, as a string, a Go duration (``15s``,
``5m``, ``1m30s``), so Helm chart values written for Go components pass through unchanged.

Default policies follow HAMi's chart (``nodeSchedulerPolicy: binpack``,
``gpuSchedulerPolicy: spread``): pack pods onto few nodes, so whole nodes stay free for large jobs,
and spread them over the cards of the chosen node, so co-located pods contend less for one card.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import yaml

from gpuslice.codec import goparse
from gpuslice.framework import registry
from gpuslice.model import config as model_config
from gpuslice.policy import api
from gpuslice.policy import mig as migs

ENV_PREFIX = "GPUSLICE_"
HAMI_LOCK_EXPIRE_ENV = "HAMI_NODELOCK_EXPIRE"
"""HAMi's node lock expiry (a Go duration such as ``5m``), used when ``node_lock_expiry_s`` is unset."""
POD_ENV = {"pod_name": "POD_NAME", "pod_namespace": "POD_NAMESPACE"}
"""Downward-API variables that give ``pod_name`` and ``pod_namespace`` when no layer sets them."""
DEFAULT_LOCK_EXPIRY_S = 300.0
LEADER_MODES = ("lease", "scheduler", "none")
MiB = 1 << 20


class ConfigError(ValueError):
    """An invalid setting; the message says which and why."""


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything ``gpuslice serve`` can be told.

    Attributes:
        node_policy: node-level policy (scores nodes in prioritize).
        card_policy: card-level policy (chooses cards at bind): a registered policy or a HAMi chain
            such as ``binpack,numa`` or ``mutex,spread`` (``policy.chains``).
        node_choice: how the node policy's choice reaches kube-scheduler: ``extender`` (the filter
            answers only the chosen node), ``rank`` (rank scores) or ``blend`` (scaled scores
            summed with kube-scheduler's plugins); see ``model.config.NODE_CHOICES``. Render the
            scheduler configuration with the same value (it sets the extender weight).
        lock_margin: lock-aware node choice (docs/node-choice.md): among the nodes whose policy
            score is within this fraction of the score scale (0..100) of the best, prefer one whose
            HAMi node lock is free, so a burst of pods binds on several nodes at once instead of
            one pod per ``Allocate`` on the best node. 0 = the policy's choice exactly; in [0, 1].
        workload_period_s: how often the shapes of newly filtered pods are handed to the cache's
            histogram (FGD's target workload); 0 = at once, before the pod is scored (each hand-over
            rebuilds the snapshot's workload, so a busy extender batches them).
        mig_placement: how GPU instances are chosen on cards in MIG mode (``policy.mig``):
            ``fragmentation`` (the instance that strands the fewest memory slices) or ``first-fit``
            (HAMi v2.10's: the smallest profile that serves the request, at its first free
            placement in HAMi's order, on the first card that has one).
        workload_decay: how the target workload of FGD-style node policies is learned from the
            requests seen (``model.config.WorkloadSettings``, docs/workload.md): a request seen k
            requests ago weighs ``decay**k``.
        workload_window: only this many most recent requests count (0 = all).
        workload_min_count: requests seen before the learned workload is trusted.
        workload_fallback: the policy (any registered name) that stands in for a policy learning
            the workload (fgd, fgd-lookahead) until it is trusted, at node and card level; ``pod``
            keeps the learning policy, measuring against each pod's own shape.
        workload_drift: the workload the policies see is re-taken from the histogram only when
            it has drifted by this total-variation distance (0 = after every request).
        shadow_policies: comma-separated registered policies evaluated beside the live one for
            every bound GPU pod, without acting (shadow mode, docs/shadow.md; flag
            ``--shadow-policy``); '' = off.
        shadow_record: JSON-lines file the shadow decisions are appended to ('' = kept in memory
            only, served at ``GET /shadow/decisions``).
        memory_scaling: multiplies every card's registered memory (overcommit when > 1).
        core_scaling: multiplies every card's registered cores.
        memory_factor: multiplies ``nvidia.com/gpumem`` requests and quota limits (HAMi).
        default_memory: MiB when a container gives neither gpumem nor a percentage; 0 = whole card.
        default_cores: cores when gpucores is absent; 0 = no SM limit.
        resource_count_name: the extended resource that asks for cards (HAMi's
            ``resourceCountName``). This and the next four are Kubernetes extended-resource
            names, all different; keep them equal to the device plugin's, the webhook's and the
            ``managedResources`` of kube-scheduler's configuration (``gpuslice render
            scheduler-config`` takes the same flags). ResourceQuota keys follow them.
        resource_memory_name: MiB per card (``resourceMemoryName``).
        resource_memory_percentage_name: percent of each card's memory
            (``resourceMemoryPercentageName``).
        resource_core_name: percent of each card's SMs (``resourceCoreName``).
        resource_priority_name: task priority (``resourcePriorityName``; only the webhook and the
            device plugin read it, kube-scheduler must ignore it).
        label_pods: label each pod it binds ``hami.io/vgpu-node=<node>`` after the device plugin's
            ``Allocate``, as HAMi's scheduler does (HAMi's vGPU monitor selects a node's pods by
            it). One write per pod; turn it off where no HAMi monitor runs.
        resync_period_s: full relist period of the informers (0 = never).
        watch_timeout_s: server-side timeout of each watch request.
        qps: client-side request rate limit to the apiserver (a bind costs about four requests,
            so 200 allows some 50 binds per second).
        burst: client-side burst above ``qps``.
        listen: ``host:port`` to serve on.
        tls_cert: serving certificate file (PEM); HTTPS when set together with ``tls_key``.
        tls_key: serving key file (PEM).
        tls_client_ca: CA bundle (PEM); when set, every client must present a certificate signed
            by it (mutual TLS; needs ``tls_cert`` and ``tls_key``).
        metrics_listen: ``host:port`` of a second, plain-HTTP listener serving only ``/metrics``,
            ``/healthz`` and ``/readyz`` ('' = none): kubelet probes and Prometheus cannot present
            client certificates (HAMi's scheduler likewise serves metrics on its own port, 9395).
        verbosity: klog-style log level (``-v``): 4 logs each node, 5 each card.
        kubeconfig: kubeconfig path; '' = ``$KUBECONFIG``, ``~/.kube/config`` or in-cluster.
        assumed_ttl_s: how long an assumed pod may wait for its informer confirmation.
        lock_wait_s: how long a bind waits for a node lock held by another pod (keep it below
            the scheduler's ``httpTimeout``).
        body_limit_bytes: largest accepted request body.
        scheduler_name: the kube-scheduler profile gpuslice serves (used in events).
        events: emit Kubernetes events for filter and bind outcomes.
        sync_wait_s: how long filter, prioritize and bind wait for the caches to finish their
            first list (or a relist) before answering an error that kube-scheduler retries.
        bind_timeout_s: the longest one bind call takes, queueing for the node, the lock wait and
            the writes included (keep it below the scheduler's ``httpTimeout``; the rendered
            config uses 30 s).
        commit_deadline_s: after the node lock is taken, the annotation write and the Binding
            must be sent within this; the recovery grace must exceed it.
        orphan_grace_s: a node lock (or a pod's bind annotations) left by a bind that no live
            bind handles is cleared once older than this.
        allocate_timeout_s: a lock whose owner is bound but whose device plugin never answered
            (no ``bind-phase: success``/``failed``) is released after this, with a Warning event.
        node_lock_expiry_s: age after which any node lock counts as expired (HAMi's
            ``--node-lock-timeout``; ``HAMI_NODELOCK_EXPIRE`` is honoured when this is unset).
        stuck_lock_s: filter rejects a node (``NodeLockHeld``) whose lock another pod has held for
            longer than this, so a stuck node stops attracting pods.
        handshake_timeout_s: a ``Requesting_`` handshake older than this marks the node's device
            plugin as gone (HAMi: 60 s) unless kubelet still advertises ``nvidia.com/gpu``.
        recovery_period_s: period of the leader's recovery loop (orphans, stuck locks, handshakes).
        preemption: GPU-aware preemption (docs/preemption.md): the leader evicts lower-priority
            pods, through the Eviction API, to free concrete cards for a pod that waits for GPUs.
        nomination_ttl_s: how long the cards freed for a preemptor stay held for it (its victims'
            grace period must fit in it).
        gangs: all-or-nothing placement of gangs (docs/gangs.md): a member of a PodGroup (or of
            gpuslice's ``gpuslice.io/gang``) is placed with its whole gang or not at all.
        gang_plan_ttl_s: how long a gang's plan holds its cards for members that have not come,
            unless the PodGroup's ``scheduleTimeoutSeconds`` (or the pod) says.
        gang_wait_s: the longest a gang member's bind waits at the barrier for the others (also
            bounded by ``bind_timeout_s`` less the lock wait and the writes).
        leader_elect: ``lease`` (gpuslice's own Lease, for a standalone Deployment behind a
            Service: the leader labels its pod and followers are ready too, see ``pod_name``;
            without a pod, followers report not-ready), ``scheduler`` (follow kube-scheduler's Lease
            as its sidecar: leader while the holder identity starts with ``leader_identity``) or
            ``none`` (a single replica that always leads).
        lease_name: the Lease gpuslice holds (``lease``) or follows (``scheduler``).
        lease_namespace: that Lease's namespace.
        leader_identity: this replica's identity ('' = the host name, which a restarted
            container keeps, so it takes its own Lease back at once).
        lease_duration_s: how long a Lease that is not renewed blocks other replicas.
        renew_deadline_s: how long the leader keeps trying to renew before it stops leading.
        retry_period_s: pause between Lease attempts and renewals.
        pod_name: this replica's pod ('' = ``$POD_NAME``, which the chart sets from the downward
            API). In ``lease`` mode, with ``pod_namespace``, the leader labels its pod
            ``gpuslice.io/leader: "true"`` (``extender.leaderlabel``), so a Service selecting that
            label routes to the leader only, and followers report ready; '' = no label (followers
            report not-ready).
        pod_namespace: that pod's namespace ('' = ``$POD_NAMESPACE``).
        header_timeout_s: a connection that has not sent complete request headers by then is
            closed.
        body_timeout_s: a request whose body has not arrived by then gets 408.
        idle_timeout_s: keep-alive connections idle for longer are closed.
        max_connections: concurrent connections served; more get 503.
        max_json_depth: deepest JSON nesting accepted in a request body (deeper: 400).
        job_label: a pod label naming the pod's job for the ``balanced`` policy's task affinity
            (docs/topology.md); a pod without it (or with this empty) belongs to its controller
            owner reference's job.
        telemetry_max_age_s: GPU telemetry (``gpuslice.io/gpu-telemetry``) older than this counts
            as absent. A healthy agent's annotation is at most its refresh period (300 s) plus one
            telemetry period (60 s) old, since it republishes unchanged readings only when they
            are older than the refresh period; 480 s leaves two more telemetry periods of margin.
    """

    node_policy: str = "binpack"
    card_policy: str = "spread"
    node_choice: str = model_config.DEFAULT_NODE_CHOICE
    lock_margin: float = model_config.DEFAULT_LOCK_MARGIN
    workload_period_s: float = 1.0
    mig_placement: str = migs.FRAGMENTATION
    workload_decay: float = model_config.DEFAULT_WORKLOAD.decay
    workload_window: int = model_config.DEFAULT_WORKLOAD.window
    workload_min_count: int = model_config.DEFAULT_WORKLOAD.min_count
    workload_fallback: str = model_config.DEFAULT_WORKLOAD.fallback
    workload_drift: float = model_config.DEFAULT_WORKLOAD.drift
    shadow_policies: str = ""
    shadow_record: str = ""
    memory_scaling: float = 1.0
    core_scaling: float = 1.0
    memory_factor: int = 1
    default_memory: int = 0
    default_cores: int = 0
    resource_count_name: str = "nvidia.com/gpu"
    resource_memory_name: str = "nvidia.com/gpumem"
    resource_memory_percentage_name: str = "nvidia.com/gpumem-percentage"
    resource_core_name: str = "nvidia.com/gpucores"
    resource_priority_name: str = "nvidia.com/priority"
    label_pods: bool = True
    resync_period_s: float = 300.0
    watch_timeout_s: int = 290
    qps: float = 200.0
    burst: int = 400
    listen: str = "127.0.0.1:8888"
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    metrics_listen: str = ""
    verbosity: int = 0
    kubeconfig: str = ""
    assumed_ttl_s: float = 30.0
    lock_wait_s: float = 3.0
    body_limit_bytes: int = MiB
    scheduler_name: str = "gpuslice-scheduler"
    events: bool = True
    sync_wait_s: float = 5.0
    bind_timeout_s: float = 20.0
    commit_deadline_s: float = 3.0
    orphan_grace_s: float = 5.0
    allocate_timeout_s: float = 60.0
    node_lock_expiry_s: float = 0.0
    stuck_lock_s: float = 5.0
    handshake_timeout_s: float = 60.0
    recovery_period_s: float = 1.0
    preemption: bool = True
    nomination_ttl_s: float = 60.0
    gangs: bool = True
    gang_plan_ttl_s: float = 60.0
    gang_wait_s: float = 12.0
    leader_elect: str = "lease"
    lease_name: str = "gpuslice-extender"
    lease_namespace: str = "kube-system"
    leader_identity: str = ""
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    pod_name: str = ""
    pod_namespace: str = ""
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    max_connections: int = 1000
    max_json_depth: int = 64
    job_label: str = ""
    telemetry_max_age_s: float = 480.0

    @property
    def host(self) -> str:
        """The listen host."""
        return self.listen.rpartition(":")[0]

    @property
    def port(self) -> int:
        """The listen port."""
        return int(self.listen.rpartition(":")[2])

    @property
    def metrics_host(self) -> str:
        """The metrics listener's host ('' when there is none)."""
        return self.metrics_listen.rpartition(":")[0]

    @property
    def metrics_port(self) -> int:
        """The metrics listener's port (0 when there is none)."""
        return int(self.metrics_listen.rpartition(":")[2] or 0)

    @property
    def shadow_names(self) -> tuple[str, ...]:
        """The shadow policies, in order, blanks and repeats dropped."""
        return tuple(dict.fromkeys(n.strip() for n in self.shadow_policies.split(",") if n.strip()))

    @property
    def resource_names(self) -> model_config.ResourceNames:
        """The configured resource names."""
        return model_config.resource_names({s: getattr(self, s) for s in model_config.NAME_SETTINGS})

    @property
    def workload(self) -> model_config.WorkloadSettings:
        """How the target workload is learned (the ``workload_*`` settings)."""
        return model_config.workload_settings({s: getattr(self, s) for s in model_config.WORKLOAD_SETTINGS})

    @property
    def request_config(self) -> model_config.RequestConfig:
        """How container resources (and ResourceQuota keys) are read."""
        return model_config.RequestConfig(
            names=self.resource_names,
            memory_factor=self.memory_factor,
            default_memory=self.default_memory,
            default_cores=self.default_cores,
        )


FIELDS: tuple[str, ...] = Settings.__struct_fields__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and one ``--<setting>`` flag per setting (no defaults: unset flags defer)."""
    parser.add_argument("--config", help="YAML file with settings (keys as the flag names, - or _)")
    parser.add_argument("-v", "--verbosity", type=int, default=argparse.SUPPRESS, help="log level 0..5")
    for name in FIELDS:
        if name == "verbosity":
            continue
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, default=argparse.SUPPRESS, metavar=name.upper())
    parser.add_argument(
        "--shadow-policy",
        dest="shadow_policies",
        default=argparse.SUPPRESS,
        metavar="NAME[,NAME]",
        help="the same as --shadow-policies: policies evaluated beside the live one (docs/shadow.md)",
    )


def _normalize(layer: Mapping[str, Any], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in layer.items():
        name = str(key).replace("-", "_")
        if name not in FIELDS:
            raise ConfigError(f"{source}: unknown setting {key!r}; known: {', '.join(FIELDS)}")
        out[name] = value
    return out


def _from_file(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"config file {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path}: invalid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of settings")
    return _normalize(data, f"config file {path}")


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX) :].lower()
            if name in FIELDS:
                out[name] = value
    return out


def load(
    argv_namespace: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Merge the layers into validated ``Settings``.

    Args:
        argv_namespace: parsed flags (from a parser set up by ``add_arguments``).
        environ: the environment; defaults to ``os.environ``.

    Raises:
        ConfigError: for unknown keys, wrong types or invalid values.
    """
    flags = dict(vars(argv_namespace)) if argv_namespace is not None else {}
    merged: dict[str, Any] = {}
    config_path = flags.pop("config", None) or (environ or os.environ).get(ENV_PREFIX + "CONFIG")
    if config_path:
        merged.update(_from_file(config_path))
    merged.update(_from_env(os.environ if environ is None else environ))
    merged.update({k: v for k, v in flags.items() if k in FIELDS})
    env = os.environ if environ is None else environ
    for name, variable in POD_ENV.items():
        if name not in merged and env.get(variable):
            merged[name] = env[variable]
    hami_expiry = env.get(HAMI_LOCK_EXPIRE_ENV)
    if "node_lock_expiry_s" not in merged and hami_expiry:
        try:
            merged["node_lock_expiry_s"] = goparse.parse_duration(hami_expiry)
        except ValueError as err:
            raise ConfigError(f"{HAMI_LOCK_EXPIRE_ENV}: {err}") from None
    return validate(merged)


def _seconds(name: str, value: Any) -> Any:
    """A ``*_s`` value as given, or the seconds of a Go duration string (``15s``, ``1m30s``).

    Raises:
        ConfigError: a string that is neither a number nor a Go duration, or a non-finite number.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(number):
            raise ConfigError(f"{name}: expected a finite number of seconds, got {value!r}")
        return text  # msgspec converts it to the field's type (int or float)
    try:
        return goparse.parse_duration(text)
    except ValueError:
        raise ConfigError(
            f"{name}: expected seconds or a Go duration such as 15s, 5m or 1m30s, got {value!r}"
        ) from None


def _host_port(value: str) -> tuple[str, int] | None:
    """``host:port`` split, or None when it is not of that form."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        return None
    return host, int(port)


_WILDCARDS = frozenset({"0.0.0.0", "::", "[::]"})


def validate(values: Mapping[str, Any]) -> Settings:
    """Build ``Settings`` from plain values (strings are converted) and check them."""
    plain = {name: _seconds(name, v) if name.endswith("_s") else v for name, v in values.items()}
    try:
        settings = msgspec.convert(plain, Settings, strict=False)
    except msgspec.ValidationError as err:
        raise ConfigError(f"invalid setting: {err}") from None
    problems: list[str] = []
    if settings.node_policy not in registry.names():
        problems.append(
            f"node_policy: unknown policy {settings.node_policy!r}; known: {', '.join(registry.names())}"
        )
    try:
        registry.card_policy(settings.card_policy)
    except api.UnknownPolicyError as err:
        problems.append(f"card_policy: {err}")
    if settings.node_choice not in model_config.NODE_CHOICES:
        known = ", ".join(model_config.NODE_CHOICES)
        problems.append(f"node_choice: expected one of {known}, got {settings.node_choice!r}")
    if settings.mig_placement not in migs.RULES:
        known = ", ".join(migs.RULES)
        problems.append(
            f"mig_placement (--mig-placement): expected one of {known}, got {settings.mig_placement!r}"
        )
    if not 0.0 <= settings.lock_margin <= 1.0:  # also refuses NaN
        problems.append(f"lock_margin must be in [0, 1], got {settings.lock_margin!r}")
    unknown_shadows = [n for n in settings.shadow_names if n not in registry.names()]
    if unknown_shadows:
        problems.append(
            f"shadow_policies: unknown policy {', '.join(map(repr, unknown_shadows))}; "
            f"known: {', '.join(registry.names())}"
        )
    if settings.shadow_record and not settings.shadow_names:
        problems.append("shadow_record needs shadow_policies")
    if not settings.workload_period_s >= 0:
        problems.append("workload_period_s must be >= 0")
    problems.extend(str(err) for err in registry.workload_errors(settings.workload))
    if settings.memory_scaling <= 0 or settings.core_scaling <= 0:
        problems.append("memory_scaling and core_scaling must be > 0")
    if settings.memory_factor < 1:
        problems.append("memory_factor must be >= 1")
    problems.extend(model_config.resource_name_problems(settings.resource_names))
    problems.extend(_listen_problems(settings))
    if bool(settings.tls_cert) != bool(settings.tls_key):
        problems.append("tls_cert and tls_key must be given together")
    if settings.tls_client_ca and not settings.tls_cert:
        problems.append("tls_client_ca needs tls_cert and tls_key (mutual TLS is served over HTTPS only)")
    for field in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(settings, field)
        if path and not Path(path).is_file():
            problems.append(f"{field}: no such file {path!r}")
    if not 0 <= settings.verbosity <= 10:
        problems.append("verbosity must be in 0..10")
    if settings.qps <= 0 or settings.burst < 1:
        problems.append("qps must be > 0 and burst >= 1")
    if not 0 <= settings.lock_wait_s < 30:
        problems.append("lock_wait_s must be in [0, 30)")
    if settings.body_limit_bytes < 1024:
        problems.append("body_limit_bytes must be >= 1024")
    if settings.assumed_ttl_s <= 0 or settings.watch_timeout_s <= 0 or settings.resync_period_s < 0:
        problems.append("assumed_ttl_s and watch_timeout_s must be > 0, resync_period_s >= 0")
    problems.extend(_fault_problems(settings))
    if problems:
        raise ConfigError("; ".join(problems))
    if settings.node_lock_expiry_s == 0:
        settings = msgspec.structs.replace(settings, node_lock_expiry_s=DEFAULT_LOCK_EXPIRY_S)
    return settings


def _listen_problems(s: Settings) -> list[str]:
    """Checks of ``listen`` and ``metrics_listen`` (host:port each, not the same socket)."""
    problems: list[str] = []
    main = _host_port(s.listen)
    if main is None:
        problems.append(f"listen: expected host:port, got {s.listen!r}")
    if not s.metrics_listen:
        return problems
    side = _host_port(s.metrics_listen)
    if side is None:
        problems.append(f"metrics_listen: expected host:port, got {s.metrics_listen!r}")
    elif main is not None and side[1] == main[1] != 0:
        if side[0] == main[0] or side[0] in _WILDCARDS or main[0] in _WILDCARDS:
            problems.append(f"metrics_listen: must differ from listen {s.listen!r}, got {s.metrics_listen!r}")
    return problems


def _fault_problems(s: Settings) -> list[str]:
    """Checks of the fault-handling, leader-election and HTTP-hardening settings."""
    problems: list[str] = []
    positive = (
        "sync_wait_s",
        "bind_timeout_s",
        "commit_deadline_s",
        "orphan_grace_s",
        "allocate_timeout_s",
        "stuck_lock_s",
        "handshake_timeout_s",
        "recovery_period_s",
        "nomination_ttl_s",
        "gang_plan_ttl_s",
        "gang_wait_s",
        "telemetry_max_age_s",
        "header_timeout_s",
        "body_timeout_s",
        "idle_timeout_s",
    )
    problems.extend(f"{name} must be > 0" for name in positive if not getattr(s, name) > 0)
    if s.node_lock_expiry_s < 0:
        problems.append("node_lock_expiry_s must be >= 0 (0: HAMI_NODELOCK_EXPIRE or 300 s)")
    if s.bind_timeout_s <= s.lock_wait_s + s.commit_deadline_s + 1:
        problems.append("bind_timeout_s must exceed lock_wait_s + commit_deadline_s + 1 s")
    if s.orphan_grace_s <= s.commit_deadline_s:
        problems.append("orphan_grace_s must exceed commit_deadline_s (a live bind is never an orphan)")
    if s.leader_elect not in LEADER_MODES:
        problems.append(f"leader_elect: expected one of {', '.join(LEADER_MODES)}, got {s.leader_elect!r}")
    if not s.lease_duration_s > s.renew_deadline_s > s.retry_period_s > 0:
        problems.append("need lease_duration_s > renew_deadline_s > retry_period_s > 0")
    if not s.lease_name or not s.lease_namespace:
        problems.append("lease_name and lease_namespace must not be empty")
    if s.max_connections < 1 or not 1 <= s.max_json_depth <= 512:
        problems.append("max_connections must be >= 1 and max_json_depth in 1..512")
    return problems


def parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Parse command-line arguments (without the subcommand) into ``Settings``."""
    parser = argparse.ArgumentParser(prog="gpuslice serve")
    add_arguments(parser)
    return load(parser.parse_args(list(argv)), environ)
