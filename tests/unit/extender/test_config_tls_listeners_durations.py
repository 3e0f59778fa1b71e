"""Settings: the client CA (mTLS), the plain metrics listener, Go durations for ``*_s`` settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.extender import config

pytestmark = pytest.mark.unit


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    # validate() checks that the files exist; their content is read only when serving.
    files = {}
    for name in ("cert", "key", "ca"):
        path = tmp_path / f"{name}.pem"
        path.write_text("-----BEGIN CERTIFICATE-----\n")
        files[name] = str(path)
    return files


# ----------------------------------------------------------------------------- client CA


def test_client_ca_by_flag_and_by_environment(pem: dict[str, str]) -> None:
    flags = ["--tls-cert", pem["cert"], "--tls-key", pem["key"], "--tls-client-ca", pem["ca"]]
    assert config.parse(flags, {}).tls_client_ca == pem["ca"]
    env = {
        "GPUSLICE_TLS_CERT": pem["cert"],
        "GPUSLICE_TLS_KEY": pem["key"],
        "GPUSLICE_TLS_CLIENT_CA": pem["ca"],
    }
    assert config.parse([], env).tls_client_ca == pem["ca"]
    assert config.Settings().tls_client_ca == ""


def test_client_ca_without_serving_certificate_is_an_error(pem: dict[str, str]) -> None:
    with pytest.raises(config.ConfigError, match="tls_client_ca needs tls_cert and tls_key"):
        config.validate({"tls_client_ca": pem["ca"]})


def test_client_ca_must_exist(pem: dict[str, str], tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(config.ConfigError, match=r"tls_client_ca: no such file '.*nope\.pem'"):
        config.validate({"tls_cert": pem["cert"], "tls_key": pem["key"], "tls_client_ca": missing})


def test_serve_exits_2_on_client_ca_without_cert(
    pem: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from gpuslice.extender import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.main(parser.parse_args(["--tls-client-ca", pem["ca"]])) == 2
    assert "tls_client_ca needs tls_cert" in capsys.readouterr().err


# ----------------------------------------------------------------------------- metrics listener


def test_metrics_listen_is_off_by_default() -> None:
    settings = config.Settings()
    assert settings.metrics_listen == "" and settings.metrics_port == 0 and settings.metrics_host == ""


def test_metrics_listen_by_flag() -> None:
    settings = config.parse(["--listen", "0.0.0.0:8888", "--metrics-listen", "0.0.0.0:9395"], {})
    assert (settings.metrics_host, settings.metrics_port) == ("0.0.0.0", 9395)
    assert config.parse([], {"GPUSLICE_METRICS_LISTEN": "127.0.0.1:9395"}).metrics_port == 9395


@pytest.mark.parametrize("value", ["9395", ":9395", "host:", "host:x", "host:65536", "host:-1"])
def test_metrics_listen_must_be_host_port(value: str) -> None:
    with pytest.raises(config.ConfigError, match=f"metrics_listen: expected host:port, got '{value}'"):
        config.validate({"metrics_listen": value})


@pytest.mark.parametrize(
    ("listen", "metrics"),
    [
        ("127.0.0.1:8888", "127.0.0.1:8888"),
        ("0.0.0.0:8888", "127.0.0.1:8888"),  # the wildcard holds every address's 8888
        ("127.0.0.1:8888", "0.0.0.0:8888"),
        ("[::]:8888", "10.0.0.1:8888"),
    ],
)
def test_metrics_listen_must_differ_from_listen(listen: str, metrics: str) -> None:
    with pytest.raises(config.ConfigError, match="metrics_listen: must differ from listen"):
        config.validate({"listen": listen, "metrics_listen": metrics})


@pytest.mark.parametrize(
    ("listen", "metrics"),
    [
        ("127.0.0.1:8888", "127.0.0.1:9395"),
        ("10.0.0.1:8888", "10.0.0.2:8888"),
        ("127.0.0.1:0", "127.0.0.1:0"),
    ],
)
def test_metrics_listen_on_another_socket_is_fine(listen: str, metrics: str) -> None:
    assert config.validate({"listen": listen, "metrics_listen": metrics}).metrics_listen == metrics


# ----------------------------------------------------------------------------- Go durations


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("15s", 15.0),
        ("5m", 300.0),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("1500ms", 1.5),
        ("0", 0.0),
        ("15", 15.0),
        ("2.5", 2.5),
        (" 2.5 ", 2.5),
        (15, 15.0),
        (2.5, 2.5),
    ],
)
def test_seconds_settings_take_numbers_and_go_durations(value: object, seconds: float) -> None:
    assert config.validate({"resync_period_s": value}).resync_period_s == seconds


def test_go_durations_from_flags_environment_and_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("lease-duration-s: 1m\nrenew-deadline-s: 40s\nretry-period-s: 5\n")
    from_file = config.parse(["--config", str(f)], {})
    assert (from_file.lease_duration_s, from_file.renew_deadline_s, from_file.retry_period_s) == (60, 40, 5)
    from_env = config.parse([], {"GPUSLICE_BIND_TIMEOUT_S": "1m", "GPUSLICE_ORPHAN_GRACE_S": "7s"})
    assert (from_env.bind_timeout_s, from_env.orphan_grace_s) == (60.0, 7.0)
    from_flags = config.parse(
        ["--lease-duration-s", "15s", "--renew-deadline-s", "10s", "--retry-period-s", "2s"]
    )
    assert (from_flags.lease_duration_s, from_flags.renew_deadline_s, from_flags.retry_period_s) == (
        15,
        10,
        2,
    )


def test_integer_seconds_setting_takes_a_whole_go_duration() -> None:
    settings = config.validate({"watch_timeout_s": "5m"})
    assert settings.watch_timeout_s == 300 and isinstance(settings.watch_timeout_s, int)
    with pytest.raises(config.ConfigError, match="watch_timeout_s"):
        config.validate({"watch_timeout_s": "1.5s"})


@pytest.mark.parametrize("value", ["fast", "15 s", "5x", "1h30", "s", "", "--5s", "1e"])
def test_bad_durations_name_the_setting(value: str) -> None:
    with pytest.raises(
        config.ConfigError,
        match=f"lock_wait_s: expected seconds or a Go duration such as 15s, 5m or 1m30s, got '{value}'",
    ):
        config.validate({"lock_wait_s": value})


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_seconds_are_rejected(value: str) -> None:
    with pytest.raises(
        config.ConfigError, match=f"resync_period_s: expected a finite number of seconds, got '{value}'"
    ):
        config.validate({"resync_period_s": value})


def test_duration_bad_in_flag_exits_2_naming_the_setting(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from gpuslice.extender import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.main(parser.parse_args(["--sync-wait-s", "5 minutes"])) == 2
    assert "sync_wait_s: expected seconds or a Go duration" in capsys.readouterr().err


def test_durations_are_checked_after_conversion() -> None:
    # 20s renew deadline > 15s lease: the usual ordering check still applies to converted values.
    with pytest.raises(config.ConfigError, match="lease_duration_s > renew_deadline_s"):
        config.validate({"lease_duration_s": "15s", "renew_deadline_s": "20s"})
    with pytest.raises(config.ConfigError, match="sync_wait_s must be > 0"):
        config.validate({"sync_wait_s": "-1s"})


def test_only_seconds_settings_take_durations() -> None:
    with pytest.raises(config.ConfigError, match="invalid setting"):
        config.validate({"qps": "15s"})
