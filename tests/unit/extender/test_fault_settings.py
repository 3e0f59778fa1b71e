"""Fault-handling settings, HAMi's lock-expiry variable and Go durations (no cluster)."""

from __future__ import annotations

import pytest

from gpuslice.codec import goparse
from gpuslice.extender import config

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300.0), ("300s", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5), ("250ms", 0.25), ("0", 0.0)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert goparse.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "m", "5 m", "5min", "1h-3m", "abc"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        goparse.parse_duration(text)


def test_lock_expiry_defaults_to_hami_and_honours_its_variable() -> None:
    assert config.parse([], {}).node_lock_expiry_s == 300.0
    assert config.parse([], {"HAMI_NODELOCK_EXPIRE": "2m"}).node_lock_expiry_s == 120.0
    # An explicit setting wins over HAMi's variable.
    explicit = config.parse(["--node-lock-expiry-s", "30"], {"HAMI_NODELOCK_EXPIRE": "2m"})
    assert explicit.node_lock_expiry_s == 30.0
    with pytest.raises(config.ConfigError, match="HAMI_NODELOCK_EXPIRE"):
        config.parse([], {"HAMI_NODELOCK_EXPIRE": "soon"})


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--leader-elect", "maybe"], "leader_elect"),
        (["--orphan-grace-s", "2", "--commit-deadline-s", "3"], "orphan_grace_s must exceed"),
        (["--lease-duration-s", "5", "--renew-deadline-s", "6"], "lease_duration_s > renew_deadline_s"),
        (["--bind-timeout-s", "7", "--lock-wait-s", "3"], "bind_timeout_s must exceed"),
        (["--header-timeout-s", "0"], "header_timeout_s must be > 0"),
        (["--max-json-depth", "0"], "max_json_depth"),
    ],
)
def test_invalid_fault_settings(flags: list[str], fragment: str) -> None:
    with pytest.raises(config.ConfigError, match=fragment):
        config.parse(flags, {})


def test_defaults_keep_a_live_bind_younger_than_the_orphan_grace() -> None:
    s = config.parse([], {})
    assert s.orphan_grace_s > s.commit_deadline_s
    assert s.bind_timeout_s < 30  # the rendered scheduler config's httpTimeout
    assert s.leader_elect == "lease"
