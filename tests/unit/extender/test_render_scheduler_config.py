"""``gpuslice render scheduler-config``: TLS to the extender, kube-scheduler leader election, key order."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpuslice.extender import render

pytestmark = pytest.mark.unit

HTTPS = "https://gpuslice.kube-system.svc:8888"


def _ext(**kwargs: Any) -> dict[str, Any]:
    extender: dict[str, Any] = render.scheduler_config(**kwargs)["extenders"][0]
    return extender


def test_plain_http_has_no_tls() -> None:
    ext = _ext(url="http://127.0.0.1:8888")
    assert "enableHTTPS" not in ext and "tlsConfig" not in ext


@pytest.mark.parametrize(
    ("kwargs", "tls"),
    [
        ({"ca_file": "/ca.crt"}, {"caFile": "/ca.crt"}),
        (
            {"ca_file": "/ca.crt", "client_cert": "/c.crt", "client_key": "/c.key"},
            {"caFile": "/ca.crt", "certFile": "/c.crt", "keyFile": "/c.key"},
        ),
        ({"ca_file": "/ca.crt", "server_name": "gpuslice"}, {"caFile": "/ca.crt", "serverName": "gpuslice"}),
        (
            {
                "server_name": "gpuslice",
                "client_key": "/c.key",
                "client_cert": "/c.crt",
                "ca_file": "/ca.crt",
            },
            {"caFile": "/ca.crt", "certFile": "/c.crt", "keyFile": "/c.key", "serverName": "gpuslice"},
        ),
        ({"insecure_tls": True}, {"insecure": True}),
        (
            {"insecure_tls": True, "client_cert": "/c.crt", "client_key": "/c.key"},
            {"insecure": True, "certFile": "/c.crt", "keyFile": "/c.key"},
        ),
    ],
    ids=["ca", "ca-client", "ca-server-name", "all", "insecure", "insecure-client"],
)
def test_https_tls_config(kwargs: dict[str, Any], tls: dict[str, Any]) -> None:
    ext = _ext(url=HTTPS, **kwargs)
    assert ext["enableHTTPS"] is True
    assert ext["tlsConfig"] == tls
    assert list(ext["tlsConfig"]) == list(tls)  # the key order a chart reproduces


@pytest.mark.parametrize(
    ("url", "kwargs", "message"),
    [
        (HTTPS, {}, "give --ca-file .* or, explicitly, --insecure-skip-tls-verify"),
        (HTTPS, {"client_cert": "/c.crt", "client_key": "/c.key"}, "give --ca-file"),
        (HTTPS, {"server_name": "x"}, "give --ca-file"),
        (
            HTTPS,
            {"ca_file": "/ca", "client_cert": "/c.crt"},
            "--client-cert and --client-key must be given together",
        ),
        (
            HTTPS,
            {"ca_file": "/ca", "client_key": "/c.key"},
            "--client-cert and --client-key must be given together",
        ),
        (HTTPS, {"insecure_tls": True, "ca_file": "/ca"}, "--insecure-skip-tls-verify excludes --ca-file"),
        (HTTPS, {"insecure_tls": True, "server_name": "x"}, "--insecure-skip-tls-verify excludes"),
        ("http://x:1", {"ca_file": "/ca"}, "TLS options need an https:// URL, got 'http://x:1': --ca-file$"),
        (
            "http://x:1",
            {"client_cert": "/c", "client_key": "/k"},
            "need an https:// URL.*: --client-cert --client-key$",
        ),
        ("http://x:1", {"server_name": "x"}, "need an https:// URL.*: --server-name$"),
        ("http://x:1", {"insecure_tls": True}, "need an https:// URL.*: --insecure-skip-tls-verify$"),
        ("x:1", {}, "url must start with http:// or https://"),
        ("http://x:1", {"http_timeout": "30"}, "http timeout: expected a Go duration"),
    ],
)
def test_tls_misfits_are_errors(url: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render.scheduler_config(url=url, **kwargs)


def test_cli_renders_mtls(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["scheduler-config", "--url", HTTPS, "--ca-file", "/ca.crt"]
    argv += ["--client-cert", "/c.crt", "--client-key", "/c.key", "--server-name", "gpuslice.kube-system.svc"]
    assert render.run(argv) == 0
    ext = yaml.safe_load(capsys.readouterr().out)["extenders"][0]
    assert ext["tlsConfig"] == {
        "caFile": "/ca.crt",
        "certFile": "/c.crt",
        "keyFile": "/c.key",
        "serverName": "gpuslice.kube-system.svc",
    }
    assert render.run(["scheduler-config", "--url", HTTPS, "--insecure-skip-tls-verify"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["extenders"][0]["tlsConfig"] == {"insecure": True}


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", HTTPS],
        ["--url", "http://x:1", "--ca-file", "/ca"],
        ["--url", HTTPS, "--ca-file", "/ca", "--client-cert", "/c"],
        ["--leader-elect", "--lease-duration", "15"],
    ],
)
def test_cli_errors_exit_2_with_a_message(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert render.run(["scheduler-config", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("gpuslice render: ")


# ----------------------------------------------------------------------------- leader election


def test_leader_election_off_is_one_field() -> None:
    assert render.scheduler_config()["leaderElection"] == {"leaderElect": False}
    # lease settings are irrelevant without leader election
    assert render.scheduler_config(lease_name="x")["leaderElection"] == {"leaderElect": False}


def test_leader_election_defaults_spell_out_every_field() -> None:
    block = render.scheduler_config(scheduler_name="gpu-sched", leader_elect=True)["leaderElection"]
    expected = {
        "leaderElect": True,
        "leaseDuration": "15s",
        "renewDeadline": "10s",
        "retryPeriod": "2s",
        "resourceLock": "leases",
        "resourceName": "gpu-sched",
        "resourceNamespace": "kube-system",
    }
    assert block == expected and list(block) == list(expected)


def test_leader_election_flags_are_written_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["scheduler-config", "--leader-elect", "--lease-duration", "1m30s", "--renew-deadline", "1m"]
    argv += ["--retry-period", "500ms", "--lease-name", "gpuslice-scheduler-lock", "--lease-namespace", "gpu"]
    assert render.run(argv) == 0
    assert yaml.safe_load(capsys.readouterr().out)["leaderElection"] == {
        "leaderElect": True,
        "leaseDuration": "1m30s",
        "renewDeadline": "1m",
        "retryPeriod": "500ms",
        "resourceLock": "leases",
        "resourceName": "gpuslice-scheduler-lock",
        "resourceNamespace": "gpu",
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lease_duration": "15"}, "lease duration: expected a Go duration"),
        ({"renew_deadline": "ten"}, "renew deadline: expected a Go duration"),
        ({"retry_period": ""}, "retry period: expected a Go duration"),
        ({"lease_duration": "10s", "renew_deadline": "10s"}, "lease duration > renew deadline"),
        ({"retry_period": "0s"}, "retry period > 0"),
        ({"lease_namespace": ""}, "lease namespace must not be empty"),
    ],
)
def test_bad_leader_election_is_an_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render.scheduler_config(leader_elect=True, **kwargs)


# ----------------------------------------------------------------------------- document shape


def test_document_key_order_is_stable() -> None:
    conf = render.scheduler_config(
        url=HTTPS,
        kubeconfig="/k",
        leader_elect=True,
        ca_file="/ca",
        client_cert="/c",
        client_key="/k",
    )
    assert list(conf) == [
        "apiVersion",
        "kind",
        "clientConnection",
        "leaderElection",
        "percentageOfNodesToScore",
        "profiles",
        "extenders",
    ]
    assert list(conf["extenders"][0]) == [
        "urlPrefix",
        "filterVerb",
        "prioritizeVerb",
        "weight",
        "bindVerb",
        "preemptVerb",
        "nodeCacheCapable",
        "httpTimeout",
        "ignorable",
        "enableHTTPS",
        "tlsConfig",
        "managedResources",
    ]
    assert yaml.safe_load(render.scheduler_config_yaml(url=HTTPS, insecure_tls=True))["extenders"][0][
        "tlsConfig"
    ] == {"insecure": True}


def test_deploy_readme_example_is_what_render_prints() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "deploy" / "README.md").read_text()
    example = readme.split("The second command renders", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    conf = render.scheduler_config(
        url="https://gpuslice.kube-system.svc:8888",
        leader_elect=True,
        ca_file="/etc/gpuslice/ca.crt",
        client_cert="/etc/gpuslice/client.crt",
        client_key="/etc/gpuslice/client.key",
        server_name="gpuslice.kube-system.svc",
    )
    assert yaml.safe_load(example) == conf
    assert example == yaml.safe_dump(conf, sort_keys=False)
