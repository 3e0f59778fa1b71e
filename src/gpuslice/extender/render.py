"""``gpuslice render scheduler-config``: the KubeSchedulerConfiguration that wires kube-scheduler to us.

The extender block follows extender-protocol.md section 10: filter, prioritize (weight > 0 is
required), bind and preempt verbs, ``nodeCacheCapable: true`` (node names only, no Node lists on
the wire), every GPU resource managed and ``ignoredByScheduler: true`` (nodes advertise only
``nvidia.com/gpu``; the others would fail the in-tree fit), ``ignorable: false`` (a pod must not be
placed without its cards), and ``percentageOfNodesToScore: 100`` so every feasible node reaches us.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from gpuslice.model import config as model_config

DEFAULT_URL = "http://127.0.0.1:8888"
DEFAULT_SCHEDULER_NAME = "gpuslice-scheduler"
DEFAULT_HTTP_TIMEOUT = "30s"


_DEFAULT_NAMES = model_config.ResourceNames()


def managed_resources(names: model_config.ResourceNames = _DEFAULT_NAMES) -> list[str]:
    """The extended resources the extender owns (decides kube-scheduler's ``IsInterested``)."""
    return [names.count, names.memory, names.memory_percentage, names.cores]


def scheduler_config(
    url: str = DEFAULT_URL,
    scheduler_name: str = DEFAULT_SCHEDULER_NAME,
    weight: int = 1,
    kubeconfig: str | None = None,
    http_timeout: str = DEFAULT_HTTP_TIMEOUT,
    preempt: bool = True,
    leader_elect: bool = False,
    insecure_tls: bool = True,
) -> dict[str, Any]:
    """The configuration as a plain dict (see the module docstring).

    Args:
        url: the extender's ``urlPrefix``.
        scheduler_name: the profile name pods put in ``spec.schedulerName``.
        weight: prioritize weight (kube-scheduler multiplies our 0..10 by ``weight x 10``).
        kubeconfig: ``clientConnection.kubeconfig``; omitted when None (in-cluster).
        http_timeout: per-call timeout, a Go duration.
        preempt: include ``preemptVerb``.
        leader_elect: kube-scheduler leader election (off for a single dev scheduler).
        insecure_tls: with an https URL, skip certificate verification.

    Raises:
        ValueError: for a weight below 1 (kube-scheduler rejects it when prioritizeVerb is set).
    """
    if weight < 1:
        raise ValueError("weight must be >= 1 when prioritizeVerb is set")
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
    if url.startswith("https://"):
        extender["enableHTTPS"] = True
        if insecure_tls:
            extender["tlsConfig"] = {"insecure": True}
    extender["managedResources"] = [{"name": n, "ignoredByScheduler": True} for n in managed_resources()]
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
    }
    if kubeconfig is not None:
        config["clientConnection"] = {"kubeconfig": kubeconfig}
    config["leaderElection"] = {"leaderElect": leader_elect}
    config["percentageOfNodesToScore"] = 100
    config["profiles"] = [{"schedulerName": scheduler_name}]
    config["extenders"] = [extender]
    return config


def scheduler_config_yaml(**kwargs: Any) -> str:
    """``scheduler_config(**kwargs)`` as YAML text."""
    return yaml.safe_dump(scheduler_config(**kwargs), sort_keys=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gpuslice render`` flags: one subcommand per generated artefact."""
    sub = parser.add_subparsers(dest="what", required=True)
    sc = sub.add_parser("scheduler-config", help="KubeSchedulerConfiguration calling gpuslice")
    sc.add_argument("--url", default=DEFAULT_URL, help="extender URL prefix")
    sc.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME)
    sc.add_argument("--weight", type=int, default=1)
    sc.add_argument("--kubeconfig", default=None, help="clientConnection.kubeconfig (omit for in-cluster)")
    sc.add_argument("--http-timeout", default=DEFAULT_HTTP_TIMEOUT)
    sc.add_argument("--no-preempt", action="store_true", help="leave out preemptVerb")
    sc.add_argument("--leader-elect", action="store_true")


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
