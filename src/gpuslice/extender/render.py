"""``gpuslice render scheduler-config``: the KubeSchedulerConfiguration that wires kube-scheduler to us.

The extender block: filter, prioritize (weight > 0 is required), bind and preempt verbs,
``nodeCacheCapable: true`` (node names only, no Node lists on the wire), every GPU resource
managed and ``ignoredByScheduler: true`` (nodes advertise only the card count; the others would
fail the in-tree fit), ``ignorable: false`` (a pod must not be placed without its cards), and
``percentageOfNodesToScore: 100`` so every feasible node reaches us.

The managed resources are the configured names (``--resource-count-name``,
``--resource-memory-name``, ``--resource-memory-percentage-name``, ``--resource-core-name``,
``--resource-priority-name``, as ``gpuslice serve`` takes them): count, memory, percentage,
cores, and priority, which HAMi's chart lists too (``charts/hami/templates/scheduler/
configmapnew.yaml``): no node advertises it, so without ``ignoredByScheduler`` a pod naming it
would never fit.

The extender ``weight`` follows ``--node-choice`` (the same setting ``gpuslice serve`` takes;
``docs/node-choice.md``) unless ``--weight`` is given: kube-scheduler adds ``score x weight x 10``
(``MaxNodeScore / MaxExtenderPriority``) to the sum of its score plugins, each ``0..100 x`` its
weight (``pkg/scheduler/apis/config/v1/default_plugins.go``: TaintToleration 3, NodeAffinity 2,
PodTopologySpread 2, InterPodAffinity 2, NodeResourcesFit 1, NodeResourcesBalancedAllocation 1,
ImageLocality 1). Under ``rank`` one rank step must outweigh what the resource-balance plugins and
the system-default topology spreading can add between two nodes (NodeResourcesFit,
BalancedAllocation, ImageLocality and PodTopologySpread: at most 500), so the weight is 51 (a step
is worth 510); the explicit preferences an operator writes (taints, node and pod affinity) can still
move a pod down when they add up to more. Under ``extender`` kube-scheduler sees one feasible node
and scores nothing; under ``blend`` the weight is 1, the policy's scaled score counting as one
plugin among the others.

An https URL needs a way to trust the extender: ``tlsConfig.caFile`` (kube-scheduler's
``ExtenderTLSConfig``), or ``insecure: true`` when asked for explicitly; with neither,
kube-scheduler would verify against the system roots, never what a cluster-internal extender
wants, so that is an error. ``certFile``/``keyFile`` present a client certificate (the extender's
``--tls-client-ca``). With ``leader_elect`` the ``leaderElection`` block spells out every field of
kube-scheduler's ``LeaderElectionConfiguration`` (durations verbatim), so a Helm chart can produce
the same document.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from gpuslice.codec import goparse
from gpuslice.model import config as model_config

DEFAULT_URL = "http://127.0.0.1:8888"
DEFAULT_SCHEDULER_NAME = "gpuslice-scheduler"
DEFAULT_HTTP_TIMEOUT = "30s"
DEFAULT_LEASE_DURATION = "15s"
DEFAULT_RENEW_DEADLINE = "10s"
DEFAULT_RETRY_PERIOD = "2s"
DEFAULT_LEASE_NAMESPACE = "kube-system"


_DEFAULT_NAMES = model_config.ResourceNames()

RANK_WEIGHT = 51
"""The extender weight under ``node_choice: rank`` (module docstring)."""


def default_weight(node_choice: str) -> int:
    """The extender weight that fits a node choice (module docstring); ValueError for an unknown one."""
    if node_choice not in model_config.NODE_CHOICES:
        raise ValueError(
            f"node choice must be one of {', '.join(model_config.NODE_CHOICES)}, got {node_choice!r}"
        )
    return RANK_WEIGHT if node_choice == "rank" else 1


def managed_resources(names: model_config.ResourceNames = _DEFAULT_NAMES) -> list[str]:
    """The extended resources the extender owns (decides kube-scheduler's ``IsInterested``)."""
    return list(names.all())


def scheduler_config(
    url: str = DEFAULT_URL,
    scheduler_name: str = DEFAULT_SCHEDULER_NAME,
    weight: int | None = None,
    kubeconfig: str | None = None,
    http_timeout: str = DEFAULT_HTTP_TIMEOUT,
    preempt: bool = True,
    leader_elect: bool = False,
    *,
    ca_file: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
    server_name: str | None = None,
    insecure_tls: bool = False,
    lease_duration: str = DEFAULT_LEASE_DURATION,
    renew_deadline: str = DEFAULT_RENEW_DEADLINE,
    retry_period: str = DEFAULT_RETRY_PERIOD,
    lease_name: str | None = None,
    lease_namespace: str = DEFAULT_LEASE_NAMESPACE,
    names: model_config.ResourceNames = _DEFAULT_NAMES,
    node_choice: str = model_config.DEFAULT_NODE_CHOICE,
) -> dict[str, Any]:
    """The configuration as a plain dict (see the module docstring).

    Args:
        url: the extender's ``urlPrefix`` (``http://`` or ``https://``).
        scheduler_name: the profile name pods put in ``spec.schedulerName``.
        weight: prioritize weight (kube-scheduler multiplies our 0..10 by ``weight x 10``); None =
            ``default_weight(node_choice)``.
        kubeconfig: ``clientConnection.kubeconfig``; omitted when None (in-cluster).
        http_timeout: per-call timeout, a Go duration.
        preempt: include ``preemptVerb``.
        leader_elect: kube-scheduler leader election (off for a single dev scheduler).
        ca_file: ``tlsConfig.caFile``: the CA that signed the extender's serving certificate.
        client_cert: ``tlsConfig.certFile``: client certificate kube-scheduler presents (mTLS).
        client_key: ``tlsConfig.keyFile``: its key (only together with ``client_cert``).
        server_name: ``tlsConfig.serverName``: the name verified in the serving certificate.
        insecure_tls: ``tlsConfig.insecure``: skip verifying the extender's certificate.
        lease_duration: ``leaderElection.leaseDuration`` (a Go duration).
        renew_deadline: ``leaderElection.renewDeadline`` (a Go duration).
        retry_period: ``leaderElection.retryPeriod`` (a Go duration).
        lease_name: ``leaderElection.resourceName``; None = ``scheduler_name``.
        lease_namespace: ``leaderElection.resourceNamespace``.
        names: the GPU resource names (``managedResources``).
        node_choice: the extender's ``node_choice`` (sets the default weight).

    Raises:
        ValueError: for a weight below 1 (kube-scheduler rejects it when prioritizeVerb is set), an
            unknown node choice,
            TLS options that do not fit the URL, invalid leader-election timings, or resource
            names that are not distinct extended-resource names.
    """
    if weight is None:
        weight = default_weight(node_choice)
    if weight < 1:
        raise ValueError("weight must be >= 1 when prioritizeVerb is set")
    problems = model_config.resource_name_problems(names)
    if problems:
        raise ValueError("; ".join(problems))
    _duration("http timeout", http_timeout)
    tls = _tls_config(url, ca_file, client_cert, client_key, server_name, insecure_tls)
    extender: dict[str, Any] = {
        "urlPrefix": url.rstrip("/"),
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": weight,
        "bindVerb": "bind",
    }
    if preempt:
        extender["preemptVerb"] = "preempt"
    extender["nodeCacheCapable"] = True
    extender["httpTimeout"] = http_timeout
    extender["ignorable"] = False
    if tls is not None:
        extender["enableHTTPS"] = True
        extender["tlsConfig"] = tls
    extender["managedResources"] = [{"name": n, "ignoredByScheduler": True} for n in managed_resources(names)]
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
    }
    if kubeconfig is not None:
        config["clientConnection"] = {"kubeconfig": kubeconfig}
    if leader_elect:
        config["leaderElection"] = _leader_election(
            lease_duration, renew_deadline, retry_period, lease_name or scheduler_name, lease_namespace
        )
    else:
        config["leaderElection"] = {"leaderElect": False}
    config["percentageOfNodesToScore"] = 100
    config["profiles"] = [{"schedulerName": scheduler_name}]
    config["extenders"] = [extender]
    return config


def _duration(what: str, text: str) -> float:
    """Seconds of a Go duration, or ValueError naming ``what``."""
    try:
        return goparse.parse_duration(text)
    except ValueError:
        raise ValueError(f"{what}: expected a Go duration such as 15s or 1m30s, got {text!r}") from None


def _tls_config(
    url: str,
    ca_file: str | None,
    client_cert: str | None,
    client_key: str | None,
    server_name: str | None,
    insecure: bool,
) -> dict[str, Any] | None:
    """The extender's ``tlsConfig`` for an https URL; None for http (ValueError on a misfit)."""
    given = {
        "--ca-file": ca_file,
        "--client-cert": client_cert,
        "--client-key": client_key,
        "--server-name": server_name,
        "--insecure-skip-tls-verify": insecure,
    }
    if url.startswith("http://"):
        flags = [flag for flag, value in given.items() if value]
        if flags:
            raise ValueError(f"TLS options need an https:// URL, got {url!r}: {' '.join(flags)}")
        return None
    if not url.startswith("https://"):
        raise ValueError(f"url must start with http:// or https://, got {url!r}")
    if bool(client_cert) != bool(client_key):
        raise ValueError("--client-cert and --client-key must be given together")
    if insecure and (ca_file or server_name):
        # client-go refuses a root CA together with insecure; a server name is never checked then.
        raise ValueError("--insecure-skip-tls-verify excludes --ca-file and --server-name")
    if not insecure and not ca_file:
        raise ValueError(
            f"{url}: give --ca-file (the CA of the extender's serving certificate) or, explicitly, "
            "--insecure-skip-tls-verify; kube-scheduler would otherwise verify it against the "
            "system roots"
        )
    tls: dict[str, Any] = {"insecure": True} if insecure else {}
    for key, value in (
        ("caFile", ca_file),
        ("certFile", client_cert),
        ("keyFile", client_key),
        ("serverName", server_name),
    ):
        if value:
            tls[key] = value
    return tls


def _leader_election(
    lease_duration: str, renew_deadline: str, retry_period: str, name: str, namespace: str
) -> dict[str, Any]:
    """kube-scheduler's ``leaderElection`` block with every field (ValueError on invalid timings)."""
    lease = _duration("lease duration", lease_duration)
    renew = _duration("renew deadline", renew_deadline)
    retry = _duration("retry period", retry_period)
    if not lease > renew > 0 or not retry > 0:
        # kube-scheduler's own validation (LeaderElectionConfiguration).
        raise ValueError("need lease duration > renew deadline > 0 and retry period > 0")
    if not name or not namespace:
        raise ValueError("lease name and lease namespace must not be empty")
    return {
        "leaderElect": True,
        "leaseDuration": lease_duration,
        "renewDeadline": renew_deadline,
        "retryPeriod": retry_period,
        "resourceLock": "leases",
        "resourceName": name,
        "resourceNamespace": namespace,
    }


def scheduler_config_yaml(**kwargs: Any) -> str:
    """``scheduler_config(**kwargs)`` as YAML text."""
    return yaml.safe_dump(scheduler_config(**kwargs), sort_keys=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuslice render`` flags: one subcommand per generated artefact."""
    sub = parser.add_subparsers(dest="what", required=True)
    sc = sub.add_parser("scheduler-config", help="KubeSchedulerConfiguration calling gpuslice")
    sc.add_argument("--url", default=DEFAULT_URL, help="extender URL prefix")
    sc.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME)
    sc.add_argument(
        "--node-choice",
        choices=model_config.NODE_CHOICES,
        default=model_config.DEFAULT_NODE_CHOICE,
        help="the extender's node_choice; sets the default weight (default %(default)s)",
    )
    sc.add_argument("--weight", type=int, default=None, help="prioritize weight (default: by --node-choice)")
    sc.add_argument("--kubeconfig", default=None, help="clientConnection.kubeconfig (omit for in-cluster)")
    sc.add_argument("--http-timeout", default=DEFAULT_HTTP_TIMEOUT)
    sc.add_argument("--no-preempt", action="store_true", help="leave out preemptVerb")
    sc.add_argument("--leader-elect", action="store_true", help="kube-scheduler leader election (a Lease)")
    sc.add_argument("--lease-duration", default=DEFAULT_LEASE_DURATION, help="Go duration")
    sc.add_argument("--renew-deadline", default=DEFAULT_RENEW_DEADLINE, help="Go duration")
    sc.add_argument("--retry-period", default=DEFAULT_RETRY_PERIOD, help="Go duration")
    sc.add_argument("--lease-name", default=None, help="the Lease (default: the scheduler name)")
    sc.add_argument("--lease-namespace", default=DEFAULT_LEASE_NAMESPACE)
    sc.add_argument("--ca-file", default=None, help="https: CA of the extender's serving certificate")
    sc.add_argument("--client-cert", default=None, help="https: client certificate to present (mTLS)")
    sc.add_argument("--client-key", default=None, help="https: the client certificate's key")
    sc.add_argument("--server-name", default=None, help="https: name to verify in the serving certificate")
    sc.add_argument(
        "--insecure-skip-tls-verify", action="store_true", help="https: do not verify the extender"
    )
    for setting, field in model_config.NAME_SETTINGS.items():
        default = getattr(_DEFAULT_NAMES, field)
        sc.add_argument(
            "--" + setting.replace("_", "-"),
            dest=setting,
            default=default,
            metavar="NAME",
            help=f"managed resource for {field.replace('_', ' ')} (default {default})",
        )


def main(args: argparse.Namespace) -> int:
    """Entry point of ``gpuslice render``: print the artefact to stdout."""
    try:
        text = scheduler_config_yaml(
            url=args.url,
            scheduler_name=args.scheduler_name,
            weight=args.weight,
            kubeconfig=args.kubeconfig,
            http_timeout=args.http_timeout,
            preempt=not args.no_preempt,
            leader_elect=args.leader_elect,
            ca_file=args.ca_file,
            client_cert=args.client_cert,
            client_key=args.client_key,
            server_name=args.server_name,
            insecure_tls=args.insecure_skip_tls_verify,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
            lease_name=args.lease_name,
            lease_namespace=args.lease_namespace,
            names=model_config.resource_names({s: getattr(args, s) for s in model_config.NAME_SETTINGS}),
            node_choice=args.node_choice,
        )
    except ValueError as err:
        print(f"gpuslice render: {err}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


def run(argv: Sequence[str]) -> int:
    """Parse ``argv`` (without ``render``) and run."""
    parser = argparse.ArgumentParser(prog="gpuslice render", description="Print generated configuration.")
    add_arguments(parser)
    return main(parser.parse_args(list(argv)))
