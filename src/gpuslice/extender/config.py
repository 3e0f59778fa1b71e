"""Settings of ``gpuslice serve``: defaults < YAML file < ``GPUSLICE_*`` environment < flags.

Settings are read once at startup into a frozen ``Settings``; anything invalid raises
``ConfigError`` with a message naming the setting, and the command exits with status 2.

Default policies follow HAMi's chart (``nodeSchedulerPolicy: binpack``,
``gpuSchedulerPolicy: spread``): pack pods onto few nodes, so whole nodes stay free for large jobs,
and spread them over the cards of the chosen node, so co-located pods contend less for one card.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import yaml

from gpuslice.model import config as model_config
from gpuslice.policy import registry

ENV_PREFIX = "GPUSLICE_"
MiB = 1 << 20


class ConfigError(ValueError):
    """An invalid setting; the message says which and why."""


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything ``gpuslice serve`` can be told.

    Attributes:
        node_policy: node-level policy (scores nodes in prioritize).
        card_policy: card-level policy (chooses cards at bind).
        memory_scaling: multiplies every card's registered memory (overcommit when > 1).
        core_scaling: multiplies every card's registered cores.
        memory_factor: multiplies ``nvidia.com/gpumem`` requests and quota limits (HAMi).
        default_memory: MiB when a container gives neither gpumem nor a percentage; 0 = whole card.
        default_cores: cores when gpucores is absent; 0 = no SM limit.
        resync_period_s: full relist period of the informers (0 = never).
        watch_timeout_s: server-side timeout of each watch request.
        qps: client-side request rate limit to the apiserver (a bind costs about four requests,
            so 200 allows some 50 binds per second).
        burst: client-side burst above ``qps``.
        listen: ``host:port`` to serve on.
        tls_cert: serving certificate file (PEM); HTTPS when set together with ``tls_key``.
        tls_key: serving key file (PEM).
        verbosity: klog-style log level (``-v``): 4 logs each node, 5 each card.
        kubeconfig: kubeconfig path; '' = ``$KUBECONFIG``, ``~/.kube/config`` or in-cluster.
        assumed_ttl_s: how long an assumed pod may wait for its informer confirmation.
        lock_wait_s: how long a bind waits for a node lock held by another pod (keep it below
            the scheduler's ``httpTimeout``).
        body_limit_bytes: largest accepted request body.
        scheduler_name: the kube-scheduler profile gpuslice serves (used in events).
        events: emit Kubernetes events for filter and bind outcomes.
    """

    node_policy: str = "binpack"
    card_policy: str = "spread"
    memory_scaling: float = 1.0
    core_scaling: float = 1.0
    memory_factor: int = 1
    default_memory: int = 0
    default_cores: int = 0
    resync_period_s: float = 300.0
    watch_timeout_s: int = 290
    qps: float = 200.0
    burst: int = 400
    listen: str = "127.0.0.1:8888"
    tls_cert: str = ""
    tls_key: str = ""
    verbosity: int = 0
    kubeconfig: str = ""
    assumed_ttl_s: float = 30.0
    lock_wait_s: float = 3.0
    body_limit_bytes: int = MiB
    scheduler_name: str = "gpuslice-scheduler"
    events: bool = True

    @property
    def host(self) -> str:
        """The listen host."""
        return self.listen.rpartition(":")[0]

    @property
    def port(self) -> int:
        """The listen port."""
        return int(self.listen.rpartition(":")[2])

    @property
    def request_config(self) -> model_config.RequestConfig:
        """How container resources are read."""
        return model_config.RequestConfig(
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
    return validate(merged)


def validate(values: Mapping[str, Any]) -> Settings:
    """Build ``Settings`` from plain values (strings are converted) and check them."""
    try:
        settings = msgspec.convert(dict(values), Settings, strict=False)
    except msgspec.ValidationError as err:
        raise ConfigError(f"invalid setting: {err}") from None
    problems: list[str] = []
    for field in ("node_policy", "card_policy"):
        name = getattr(settings, field)
        if name not in registry.names():
            problems.append(f"{field}: unknown policy {name!r}; known: {', '.join(registry.names())}")
    if settings.memory_scaling <= 0 or settings.core_scaling <= 0:
        problems.append("memory_scaling and core_scaling must be > 0")
    if settings.memory_factor < 1:
        problems.append("memory_factor must be >= 1")
    host, sep, port = settings.listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        problems.append(f"listen: expected host:port, got {settings.listen!r}")
    if bool(settings.tls_cert) != bool(settings.tls_key):
        problems.append("tls_cert and tls_key must be given together")
    for field in ("tls_cert", "tls_key"):
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
    if problems:
        raise ConfigError("; ".join(problems))
    return settings


def parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Parse command-line arguments (without the subcommand) into ``Settings``."""
    parser = argparse.ArgumentParser(prog="gpuslice serve")
    add_arguments(parser)
    return load(parser.parse_args(list(argv)), environ)
