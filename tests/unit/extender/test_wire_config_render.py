from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
import numpy as np
import pytest
import yaml

from gpuslice.extender import config, render, wire

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("internal", "wire_score"),
    [(0, 0), (4, 0), (5, 1), (14, 1), (15, 2), (50, 5), (94, 9), (95, 10), (100, 10), (150, 10), (-3, 0)],
    ids=lambda v: str(v),
)
def test_score_maps_0_100_to_0_10_rounding_half_up(internal: int, wire_score: int) -> None:
    # score * 10 / 100, rounded half up; out of range clamped.
    assert wire.to_extender_score(internal) == wire_score


def test_wire_keys_are_pascal_case_with_go_acronyms() -> None:
    args = wire.BIND_DECODER.decode(b'{"PodName":"p","PodNamespace":"ns","PodUID":"u1","Node":"n"}')
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == ("p", "ns", "u1", "n")
    victims = wire.ExtenderPreemptionResult({"n": wire.MetaVictims([wire.MetaPod("u")], 1)})
    assert msgspec.json.decode(wire.ENCODER.encode(victims)) == {
        "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": "u"}], "NumPDBViolations": 1}}
    }
    result = wire.ExtenderFilterResult([], {}, {})
    assert (
        wire.ENCODER.encode(result)
        == b'{"NodeNames":[],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'
    )


@pytest.mark.parametrize(
    "names",
    [[], ["n1"], ["n1", "n2", "n1"], ['odd"name\\', "n2", "ünï"]],
    ids=["none", "one", "repeated", "escaped"],
)
def test_encode_priorities_matches_struct_encoding(names: list[str]) -> None:
    internal = np.array([(37 * i) % 101 for i in range(len(names))], np.int64)  # 0, 37, 74
    wire_scores = wire.extender_scores(internal)
    expected = wire.ENCODER.encode(
        [wire.HostPriority(n, wire.to_extender_score(int(s))) for n, s in zip(names, internal, strict=True)]
    )
    assert wire.encode_priorities(names, wire_scores) == expected
    assert wire.encode_priorities(names, wire_scores) == expected  # second call: cached heads
    names_json = wire.ENCODER.encode(names)
    if wire.plain_names(names_json):
        assert wire.encode_priorities_raw(names_json, wire_scores) == expected
    elif names:  # the escaped names: the split path refuses them
        assert b"\\" in names_json


def test_prioritize_key_decoder_reads_uid_and_version_only() -> None:
    body = (
        b'{"Pod":{"metadata":{"uid":"u","resourceVersion":"7","name":"p"},"spec":{"x":[1]}},'
        b'"NodeNames":["a"]}'
    )
    args = wire.PRIORITIZE_KEY_DECODER.decode(body)
    meta = args.pod.metadata
    assert (meta.uid, meta.resource_version, bytes(args.node_names)) == ("u", "7", b'["a"]')


def test_pod_decodes_only_needed_fields_and_ignores_unknown() -> None:
    body = (
        b'{"Pod":{"metadata":{"name":"p","namespace":"ns","uid":"u","managedFields":[{"x":1}],'
        b'"annotations":{"a":"b"}},"spec":{"initContainers":[{"name":"i"}],"containers":[{"name":"c",'
        b'"image":"x","resources":{"limits":{"nvidia.com/gpu":"1"}}}],"nodeName":"","tolerations":[]},'
        b'"status":{"phase":"Pending"}},"Nodes":null,"NodeNames":["a"]}'
    )
    args = wire.FILTER_DECODER.decode(body)
    d = args.pod.to_dict()
    assert d["metadata"] == {"name": "p", "namespace": "ns", "uid": "u", "annotations": {"a": "b"}}
    assert d["spec"]["initContainers"] == [{"name": "i"}]
    assert d["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert args.node_names == ["a"]


def test_settings_layers_defaults_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "gpuslice.yaml"
    f.write_text("node-policy: spread\nqps: 10\nlisten: 127.0.0.1:9000\n")
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    ns = parser.parse_args(["--config", str(f), "--listen", "127.0.0.1:9100", "-v", "4"])
    s = config.load(ns, {"GPUSLICE_QPS": "20", "GPUSLICE_CARD_POLICY": "binpack", "OTHER": "x"})
    assert s.node_policy == "spread"  # file
    assert s.qps == 20.0  # env beats file
    assert s.card_policy == "binpack"  # env
    assert s.listen == "127.0.0.1:9100" and s.port == 9100  # flag beats file
    assert s.verbosity == 4
    assert s.body_limit_bytes == 1 << 20  # default
    assert config.Settings().node_policy == "binpack" and config.Settings().card_policy == "spread"


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"node_policy": "nope"}, "unknown policy 'nope'"),
        ({"listen": "8888"}, "listen"),
        ({"qps": "fast"}, "invalid setting"),
        ({"tls_cert": "/nonexistent.pem"}, "tls_cert and tls_key"),
        ({"memory_scaling": 0}, "memory_scaling"),
        ({"verbosity": 11}, "verbosity"),
    ],
    ids=["policy", "listen", "type", "tls-pair", "scaling", "verbosity"],
)
def test_invalid_settings_raise_config_error(values: dict[str, object], fragment: str) -> None:
    with pytest.raises(config.ConfigError, match=fragment):
        config.validate(values)


@pytest.mark.parametrize("value", ["binpack,numa", "mutex", "numa,spread", "mutex,topology-aware", "fgd"])
def test_card_policy_may_be_a_hami_chain(value: str) -> None:
    assert config.validate({"card_policy": value}).card_policy == value


@pytest.mark.parametrize(("value", "fragment"), [("fgd,numa", "cannot be chained"), ("binpack,x", "'x'")])
def test_invalid_card_policy_chains_are_refused(value: str, fragment: str) -> None:
    with pytest.raises(config.ConfigError, match=fragment):
        config.validate({"card_policy": value})


def test_unknown_file_key_is_rejected(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("nodepolicy: binpack\n")
    with pytest.raises(config.ConfigError, match="unknown setting 'nodepolicy'"):
        config.parse(["--config", str(f)], {})


def test_scheduler_config_has_every_required_field() -> None:
    conf = yaml.safe_load(render.scheduler_config_yaml(url="http://127.0.0.1:9999/", kubeconfig="/k"))
    assert conf["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert conf["percentageOfNodesToScore"] == 100
    assert conf["leaderElection"] == {"leaderElect": False}
    assert conf["clientConnection"] == {"kubeconfig": "/k"}
    assert conf["profiles"] == [{"schedulerName": "gpuslice-scheduler"}]
    (ext,) = conf["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:9999"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"], ext["preemptVerb"]) == (
        "filter",
        "prioritize",
        "bind",
        "preempt",
    )
    assert ext["weight"] == 1 and ext["nodeCacheCapable"] is True and ext["ignorable"] is False
    assert [m["name"] for m in ext["managedResources"]] == [
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "nvidia.com/priority",
    ]
    assert all(m["ignoredByScheduler"] for m in ext["managedResources"])


def test_render_https_and_weight_validation(capsys: pytest.CaptureFixture[str]) -> None:
    ext = render.scheduler_config(url="https://x:443", insecure_tls=True)["extenders"][0]
    assert ext["enableHTTPS"] is True and ext["tlsConfig"] == {"insecure": True}
    assert render.run(["scheduler-config", "--weight", "0"]) == 2
    assert render.run(["scheduler-config", "--scheduler-name", "s2", "--no-preempt"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["profiles"] == [{"schedulerName": "s2"}] and "preemptVerb" not in out["extenders"][0]


def test_serve_exits_2_with_a_clear_line_on_invalid_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuslice.extender import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.main(parser.parse_args(["--node-policy", "nope", "--listen", "x"])) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuslice serve: ") and "unknown policy 'nope'" in err and "listen" in err
    assert "Traceback" not in err


def test_cli_dispatches_render(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuslice import cli

    assert cli.main(["render", "scheduler-config", "--url", "http://127.0.0.1:1"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["extenders"][0]["urlPrefix"] == "http://127.0.0.1:1"
