"""Settings of ``gpuslice webhook``: defaults < ``GPUSLICE_WEBHOOK_*`` environment < flags.

Read once at startup into a frozen ``Settings``; anything invalid raises ``ConfigError`` with a
message naming the setting, and the command prints it on one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from gpuslice.model import config as model_config

ENV_PREFIX = "GPUSLICE_WEBHOOK_"
DEFAULT_SCHEDULER_NAME = "gpuslice-scheduler"
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)


class ConfigError(ValueError):
    """An invalid setting; the message says which and why."""


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything ``gpuslice webhook`` can be told.

    Attributes:
        listen: ``host:port`` to serve on (the apiserver calls webhooks over HTTPS only, so give
            ``tls_cert`` and ``tls_key`` outside tests).
        tls_cert: serving certificate file (PEM); HTTPS when set together with ``tls_key``.
        tls_key: serving key file (PEM).
        scheduler_name: the scheduler profile GPU pods are given (kube-scheduler's profile that
            calls gpuslice).
        deny_privileged: refuse GPU pods with a privileged container (HAMi's webhook does).
        kubeconfig: kubeconfig path; '' = in-cluster, else ``$KUBECONFIG`` or ``~/.kube/config``.
        verbosity: log level (``-v``): 0 refusals, 2 patches, 4 every review.
        resource_count_name: the extended resource that asks for cards (HAMi's
            ``resourceCountName``); this and the next four must equal ``gpuslice serve``'s.
        resource_memory_name: MiB per card (``resourceMemoryName``).
        resource_memory_percentage_name: percent of each card's memory
            (``resourceMemoryPercentageName``).
        resource_core_name: percent of each card's SMs (``resourceCoreName``).
        resource_priority_name: task priority (``resourcePriorityName``).
    """

    listen: str = "127.0.0.1:8443"
    tls_cert: str = ""
    tls_key: str = ""
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    deny_privileged: bool = False
    kubeconfig: str = ""
    verbosity: int = 0
    resource_count_name: str = "nvidia.com/gpu"
    resource_memory_name: str = "nvidia.com/gpumem"
    resource_memory_percentage_name: str = "nvidia.com/gpumem-percentage"
    resource_core_name: str = "nvidia.com/gpucores"
    resource_priority_name: str = "nvidia.com/priority"

    @property
    def resource_names(self) -> model_config.ResourceNames:
        """The configured resource names."""
        return model_config.resource_names({s: getattr(self, s) for s in model_config.NAME_SETTINGS})

    @property
    def request_config(self) -> model_config.RequestConfig:
        """How the webhook reads container resources (HAMi's defaults, the configured names)."""
        return model_config.RequestConfig(names=self.resource_names)

    @property
    def host(self) -> str:
        """The listen host."""
        return self.listen.rpartition(":")[0]

    @property
    def port(self) -> int:
        """The listen port."""
        return int(self.listen.rpartition(":")[2])


FIELDS: tuple[str, ...] = Settings.__struct_fields__


def env_name(field: str) -> str:
    """The environment variable of a setting (``GPUSLICE_WEBHOOK_SCHEDULER_NAME``)."""
    return ENV_PREFIX + field.upper()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting (no defaults: unset flags defer to the environment)."""
    parser.add_argument(
        "--listen", default=argparse.SUPPRESS, metavar="HOST:PORT", help="serve here (default 127.0.0.1:8443)"
    )
    parser.add_argument("--tls-cert", dest="tls_cert", default=argparse.SUPPRESS, help="serving cert (PEM)")
    parser.add_argument("--tls-key", dest="tls_key", default=argparse.SUPPRESS, help="serving key (PEM)")
    parser.add_argument(
        "--scheduler-name",
        dest="scheduler_name",
        default=argparse.SUPPRESS,
        help=f"schedulerName given to GPU pods (default {DEFAULT_SCHEDULER_NAME})",
    )
    parser.add_argument(
        "--deny-privileged",
        dest="deny_privileged",
        action=argparse.BooleanOptionalAction,
        default=argparse.SUPPRESS,
        help="refuse GPU pods with a privileged container (default: allow)",
    )
    parser.add_argument(
        "--kubeconfig", default=argparse.SUPPRESS, help="kubeconfig (default: in-cluster, $KUBECONFIG)"
    )
    parser.add_argument("-v", "--verbosity", type=int, default=argparse.SUPPRESS, help="log level 0..10")
    defaults = model_config.ResourceNames()
    for setting, field in model_config.NAME_SETTINGS.items():
        parser.add_argument(
            "--" + setting.replace("_", "-"),
            dest=setting,
            default=argparse.SUPPRESS,
            metavar="NAME",
            help=f"extended resource for {field.replace('_', ' ')} (default {getattr(defaults, field)})",
        )


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    return {name: environ[env_name(name)] for name in FIELDS if env_name(name) in environ}


def load(
    argv_namespace: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Merge environment and flags into validated ``Settings``.

    Raises:
        ConfigError: for wrong types or invalid values.
    """
    merged = _from_env(os.environ if environ is None else environ)
    flags = vars(argv_namespace) if argv_namespace is not None else {}
    merged.update({k: v for k, v in flags.items() if k in FIELDS})
    return validate(merged)


def validate(values: Mapping[str, Any]) -> Settings:
    """Build ``Settings`` from plain values (strings are converted) and check them.

    Raises:
        ConfigError: for unknown keys, wrong types or invalid values.
    """
    try:
        settings = msgspec.convert(dict(values), Settings, strict=False)
    except msgspec.ValidationError as err:
        raise ConfigError(f"invalid setting: {err}") from None
    problems: list[str] = []
    host, sep, port = settings.listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        problems.append(f"listen: expected host:port, got {settings.listen!r}")
    if bool(settings.tls_cert) != bool(settings.tls_key):
        problems.append("tls_cert and tls_key must be given together")
    for field in ("tls_cert", "tls_key"):
        path = getattr(settings, field)
        if path and not Path(path).is_file():
            problems.append(f"{field}: no such file {path!r}")
    name = settings.scheduler_name
    # spec.schedulerName must be a DNS-1123 subdomain (Kubernetes ValidatePodSpec).
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        problems.append(f"scheduler_name: expected a DNS-1123 subdomain, got {name!r}")
    if settings.kubeconfig and not Path(settings.kubeconfig).is_file():
        problems.append(f"kubeconfig: no such file {settings.kubeconfig!r}")
    if not 0 <= settings.verbosity <= 10:
        problems.append("verbosity must be in 0..10")
    problems.extend(model_config.resource_name_problems(settings.resource_names))
    if problems:
        raise ConfigError("; ".join(problems))
    return settings


def parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Parse command-line arguments (without the subcommand) into ``Settings``."""
    parser = argparse.ArgumentParser(prog="gpuslice webhook")
    add_arguments(parser)
    return load(parser.parse_args(list(argv)), environ)
