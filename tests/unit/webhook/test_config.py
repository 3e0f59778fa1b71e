from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.model import config as model_config
from gpuslice.webhook import config

pytestmark = pytest.mark.unit


def test_defaults() -> None:
    s = config.parse([], environ={})
    assert s == config.Settings()
    assert (s.listen, s.host, s.port, s.scheduler_name, s.deny_privileged) == (
        "127.0.0.1:8443",
        "127.0.0.1",
        8443,
        "gpuslice-scheduler",
        False,
    )


def test_flags_override_environment(tmp_path: Path) -> None:
    cert, key, kc = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "kubeconfig"
    for f in (cert, key, kc):
        f.write_text("x")
    env = {
        "GPUSLICE_WEBHOOK_LISTEN": "0.0.0.0:9443",
        "GPUSLICE_WEBHOOK_SCHEDULER_NAME": "from-env",
        "GPUSLICE_WEBHOOK_DENY_PRIVILEGED": "true",
        "GPUSLICE_WEBHOOK_VERBOSITY": "3",
        "GPUSLICE_WEBHOOK_TLS_CERT": str(cert),
        "GPUSLICE_WEBHOOK_TLS_KEY": str(key),
        "GPUSLICE_WEBHOOK_KUBECONFIG": str(kc),
    }
    s = config.parse([], environ=env)
    assert (s.listen, s.scheduler_name, s.deny_privileged, s.verbosity) == (
        "0.0.0.0:9443",
        "from-env",
        True,
        3,
    )
    assert (s.tls_cert, s.tls_key, s.kubeconfig) == (str(cert), str(key), str(kc))
    s = config.parse(
        ["--scheduler-name", "flag", "--no-deny-privileged", "-v", "1", "--listen", "[::1]:1"], env
    )
    assert (s.scheduler_name, s.deny_privileged, s.verbosity, s.host, s.port) == (
        "flag",
        False,
        1,
        "[::1]",
        1,
    )


def test_env_names() -> None:
    assert [config.env_name(f) for f in config.FIELDS] == [
        "GPUSLICE_WEBHOOK_LISTEN",
        "GPUSLICE_WEBHOOK_TLS_CERT",
        "GPUSLICE_WEBHOOK_TLS_KEY",
        "GPUSLICE_WEBHOOK_SCHEDULER_NAME",
        "GPUSLICE_WEBHOOK_DENY_PRIVILEGED",
        "GPUSLICE_WEBHOOK_KUBECONFIG",
        "GPUSLICE_WEBHOOK_VERBOSITY",
        "GPUSLICE_WEBHOOK_RESOURCE_COUNT_NAME",
        "GPUSLICE_WEBHOOK_RESOURCE_MEMORY_NAME",
        "GPUSLICE_WEBHOOK_RESOURCE_MEMORY_PERCENTAGE_NAME",
        "GPUSLICE_WEBHOOK_RESOURCE_CORE_NAME",
        "GPUSLICE_WEBHOOK_RESOURCE_PRIORITY_NAME",
    ]


def test_resource_names_from_environment_and_flags() -> None:
    s = config.parse([], environ={})
    assert s.resource_names == model_config.ResourceNames()
    assert s.request_config == model_config.DEFAULT_REQUEST_CONFIG
    env = {
        "GPUSLICE_WEBHOOK_RESOURCE_COUNT_NAME": "example.com/vgpu",
        "GPUSLICE_WEBHOOK_RESOURCE_MEMORY_NAME": "example.com/vmem",
    }
    s = config.parse(
        [
            "--resource-memory-name",
            "flag.io/vmem",
            "--resource-memory-percentage-name",
            "flag.io/pct",
            "--resource-core-name",
            "flag.io/cores",
            "--resource-priority-name",
            "flag.io/prio",
        ],
        environ=env,
    )
    want = model_config.ResourceNames(
        count="example.com/vgpu",
        memory="flag.io/vmem",
        memory_percentage="flag.io/pct",
        cores="flag.io/cores",
        priority="flag.io/prio",
    )
    assert s.resource_names == want and s.request_config.names == want


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        (["--listen", "8443"], {}, "listen: expected host:port"),
        (["--listen", "h:99999"], {}, "listen"),
        (["--tls-cert", "/nonexistent"], {}, "tls_cert and tls_key must be given together"),
        (["--tls-cert", "/nonexistent", "--tls-key", "/nonexistent"], {}, "no such file"),
        (["--scheduler-name", "Not_Valid"], {}, "DNS-1123"),
        (["-v", "11"], {}, "verbosity"),
        ([], {"GPUSLICE_WEBHOOK_DENY_PRIVILEGED": "perhaps"}, "deny_privileged"),
        ([], {"GPUSLICE_WEBHOOK_VERBOSITY": "loud"}, "verbosity"),
        (["--kubeconfig", "/nonexistent"], {}, "kubeconfig"),
        (["--resource-count-name", "gpu"], {}, "resource_count_name: 'gpu' is not an extended-resource name"),
        (
            [],
            {"GPUSLICE_WEBHOOK_RESOURCE_MEMORY_NAME": "nvidia.com/gpu"},
            "resource_count_name and resource_memory_name must differ",
        ),
    ],
)
def test_invalid_settings(argv: list[str], env: dict[str, str], fragment: str) -> None:
    with pytest.raises(config.ConfigError, match=fragment):
        config.parse(argv, environ=env)


def test_cli_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuslice import cli

    assert cli.main(["webhook", "--listen", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuslice webhook: listen")
