"""``gpuslice render scheduler-config`` lists the configured resource names as managed resources."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpuslice.extender import render
from gpuslice.model import config as model_config

pytestmark = pytest.mark.unit

FLAGS = [
    "--resource-count-name=example.com/vgpu",
    "--resource-memory-name=example.com/vmem",
    "--resource-memory-percentage-name=example.com/vmem-percentage",
    "--resource-core-name=example.com/vcores",
    "--resource-priority-name=example.com/vprio",
]


def managed(conf: dict[str, Any]) -> list[tuple[str, bool]]:
    (ext,) = conf["extenders"]
    return [(m["name"], m["ignoredByScheduler"]) for m in ext["managedResources"]]


def test_defaults_are_hamis_five_names() -> None:
    assert managed(render.scheduler_config()) == [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpumem", True),
        ("nvidia.com/gpumem-percentage", True),
        ("nvidia.com/gpucores", True),
        ("nvidia.com/priority", True),
    ]


def test_flags_rename_every_managed_resource(capsys: pytest.CaptureFixture[str]) -> None:
    assert render.run(["scheduler-config", *FLAGS]) == 0
    assert managed(yaml.safe_load(capsys.readouterr().out)) == [
        ("example.com/vgpu", True),
        ("example.com/vmem", True),
        ("example.com/vmem-percentage", True),
        ("example.com/vcores", True),
        ("example.com/vprio", True),
    ]
    assert render.run(["scheduler-config", "--resource-memory-name=example.com/vmem"]) == 0
    assert [n for n, _ in managed(yaml.safe_load(capsys.readouterr().out))][:2] == [
        "nvidia.com/gpu",
        "example.com/vmem",
    ]


def test_the_function_takes_names() -> None:
    names = model_config.ResourceNames(count="example.com/vgpu")
    assert managed(render.scheduler_config(names=names))[0] == ("example.com/vgpu", True)
    assert render.managed_resources(names) == list(names.all())


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--resource-count-name=gpu"], "resource_count_name: 'gpu' is not an extended-resource name"),
        (
            ["--resource-core-name=nvidia.com/gpumem"],
            "resource_memory_name and resource_core_name must differ",
        ),
    ],
)
def test_invalid_names_exit_2(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert render.run(["scheduler-config", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuslice render: ") and fragment in err
    with pytest.raises(ValueError, match="must differ"):
        render.scheduler_config(names=model_config.ResourceNames(cores="nvidia.com/gpu"))
