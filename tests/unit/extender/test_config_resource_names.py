"""``gpuslice serve`` resource-name settings: flags, environment, YAML, validation, and their use."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.codec import resources
from gpuslice.extender import config
from gpuslice.model import config as model_config

pytestmark = pytest.mark.unit

RENAMED = {
    "resource_count_name": "example.com/vgpu",
    "resource_memory_name": "example.com/vmem",
    "resource_memory_percentage_name": "example.com/vmem-percentage",
    "resource_core_name": "example.com/vcores",
    "resource_priority_name": "example.com/vprio",
}
NAMES = model_config.ResourceNames(
    count="example.com/vgpu",
    memory="example.com/vmem",
    memory_percentage="example.com/vmem-percentage",
    cores="example.com/vcores",
    priority="example.com/vprio",
)


def test_defaults_are_hamis_names() -> None:
    s = config.parse([], {})
    assert s.resource_names == model_config.ResourceNames()
    assert s.request_config.names == model_config.ResourceNames()


def test_every_name_is_a_flag_an_environment_variable_and_a_yaml_key(tmp_path: Path) -> None:
    flags = [arg for setting, value in RENAMED.items() for arg in ("--" + setting.replace("_", "-"), value)]
    assert config.parse(flags, {}).resource_names == NAMES
    env = {"GPUSLICE_" + setting.upper(): value for setting, value in RENAMED.items()}
    assert config.parse([], env).resource_names == NAMES
    f = tmp_path / "c.yaml"
    f.write_text("".join(f"{setting.replace('_', '-')}: {value}\n" for setting, value in RENAMED.items()))
    assert config.parse(["--config", str(f)], {}).resource_names == NAMES
    # Flags win over the environment, which wins over the file.
    s = config.parse(
        ["--config", str(f), "--resource-count-name", "flag.io/gpu"],
        {"GPUSLICE_RESOURCE_COUNT_NAME": "env.io/gpu", "GPUSLICE_RESOURCE_CORE_NAME": "env.io/cores"},
    )
    assert (s.resource_count_name, s.resource_core_name, s.resource_memory_name) == (
        "flag.io/gpu",
        "env.io/cores",
        "example.com/vmem",
    )


def test_the_request_config_carries_the_names_and_the_parse_settings() -> None:
    s = config.validate({**RENAMED, "memory_factor": 2, "default_cores": 10})
    rc = s.request_config
    assert (rc.names, rc.memory_factor, rc.default_cores) == (NAMES, 2, 10)
    # What the extender's pod reader and quota informer get (app._Requests, feed -> sync.Sync).
    pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"example.com/vmem": "100"}}}]}}
    (got,) = resources.parse_pod(pod, rc).containers
    assert got is not None and (got.count, got.memory_mib, got.cores) == (1, 200, 10)
    q = resources.parse_quota({"limits.example.com/vmem": "1000", "example.com/vcores": "50"}, rc)
    assert (q.memory_mib, q.cores) == (2000, 50)


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"resource_count_name": "gpu"}, "resource_count_name: 'gpu' is not an extended-resource name"),
        ({"resource_memory_name": "kubernetes.io/mem"}, "resource_memory_name: 'kubernetes.io/mem'"),
        ({"resource_core_name": "requests.x.io/c"}, "resource_core_name"),
        ({"resource_priority_name": "Upper.io/p"}, "resource_priority_name"),
        ({"resource_memory_percentage_name": "x.io/"}, "resource_memory_percentage_name"),
        (
            {"resource_core_name": "nvidia.com/gpu"},
            "resource_count_name and resource_core_name must differ, got 'nvidia.com/gpu' for each",
        ),
    ],
)
def test_invalid_names_are_refused_naming_the_setting(values: dict[str, str], fragment: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.validate(values)
    assert fragment in str(caught.value)


def test_serve_exits_2_on_a_bad_name(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuslice import cli

    assert cli.main(["serve", "--resource-count-name", "gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "resource_count_name: 'gpu'" in err
