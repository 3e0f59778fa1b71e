"""What ``images.json`` says of an OCI archive (``imagearchive``), and how ``images`` reads it back.

The archives here are made in the test: one by ``ociimage`` (an uncompressed layer, named for
containerd), one as ``buildah push oci-archive:`` writes them (gzip layers, named only by the OCI
``ref.name`` annotation, a user in the config).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpuslice_dev import imagearchive, images, ociimage
from gpuslice_dev.paths import REPO_ROOT

pytestmark = pytest.mark.unit


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _buildah_like(
    path: Path,
    layers: list[bytes],
    *,
    user: str = "65532:65532",
    ref: str | None = "ghcr.io/gpuslice/gpuslice:0.1.0",
    diff_ids: list[str] | None = None,
    manifests: int = 1,
) -> dict[str, object]:
    """An OCI archive with gzip layers; returns what ``describe`` must report for it."""
    compressed = [gzip.compress(layer, mtime=0) for layer in layers]
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"User": user, "Entrypoint": ["gpuslice"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids or [_digest(layer) for layer in layers]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": imagearchive.MANIFEST_TYPES[0],
            "config": {"mediaType": ociimage.MEDIA_CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [
                {"mediaType": ociimage.MEDIA_LAYER + "+gzip", "digest": _digest(c), "size": len(c)}
                for c in compressed
            ],
        }
    ).encode()
    entry: dict[str, object] = {
        "mediaType": imagearchive.MANIFEST_TYPES[0],
        "digest": _digest(manifest),
        "size": len(manifest),
    }
    if ref is not None:
        entry["annotations"] = {imagearchive.ANNOTATION_REF_NAME: ref}
    index = json.dumps({"schemaVersion": 2, "manifests": [entry] * manifests}).encode()
    with tarfile.open(path, "w") as tar:
        for name, blob in [
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", index),
            *[(f"blobs/sha256/{_digest(b)[7:]}", b) for b in [config, manifest, *compressed]],
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return {
        "reference": ref,
        "archive": path.name,
        "digest": _digest(manifest),
        "layers": len(layers),
        "uncompressed_size": sum(len(layer) for layer in layers),
        "compressed_size": sum(len(c) for c in compressed),
        "user": user,
    }


def test_describe_reads_gzip_layers_the_oci_ref_name_and_the_user(tmp_path: Path) -> None:
    layers = [_layer({"usr/bin/python3": b"\x7fELF" * 5000}), _layer({"opt/gpuslice/x.py": b"print(1)\n"})]
    expected = _buildah_like(tmp_path / "gpuslice-image.oci.tar", layers)
    got = imagearchive.describe(tmp_path / "gpuslice-image.oci.tar")
    assert got == expected
    assert int(str(got["uncompressed_size"])) > int(str(got["compressed_size"]))  # 20 kB of repeats


def test_describe_reads_an_uncompressed_layer_named_for_containerd(tmp_path: Path) -> None:
    image = ociimage.write_layout(
        tmp_path / "pause.tar", "gpuslice.local/pause:1", {"/pause": ociimage.File(data=b"x" * 100)}
    )
    got = imagearchive.describe(image.path)
    assert got["reference"] == "gpuslice.local/pause:1"
    assert got["digest"] == image.digest
    assert got["layers"] == 1
    assert got["user"] == ""
    assert got["compressed_size"] == got["uncompressed_size"]
    assert int(str(got["uncompressed_size"])) > 100


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ref": None}, "not named"),
        ({"manifests": 2}, "expected one image manifest"),
        ({"diff_ids": ["sha256:" + "0" * 64]}, "uncompressed digest"),
    ],
    ids=["unnamed", "two-manifests", "diff-id-mismatch"],
)
def test_describe_refuses_what_it_cannot_vouch_for(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    path = tmp_path / "bad.tar"
    _buildah_like(path, [_layer({"a": b"a"})], **kwargs)
    with pytest.raises(imagearchive.ArchiveError, match=message):
        imagearchive.describe(path)


def _built_dir(tmp_path: Path) -> Path:
    out = tmp_path / "images"
    out.mkdir()
    _buildah_like(out / "gpuslice-image.oci.tar", [_layer({"a": b"a"})])
    _buildah_like(
        out / "kube-scheduler-image.oci.tar",
        [_layer({"usr/local/bin/kube-scheduler": b"\x7fELF"})],
        user="",
        ref="registry.k8s.io/kube-scheduler:v1.34.4",
    )
    code = imagearchive.main(
        [
            str(out / images.INDEX),
            f"{images.GPUSLICE}={out / 'gpuslice-image.oci.tar'}",
            f"{images.KUBE_SCHEDULER}={out / 'kube-scheduler-image.oci.tar'}",
        ]
    )
    assert code == 0
    return out


def test_images_load_reads_back_what_the_index_wrote(tmp_path: Path) -> None:
    out = _built_dir(tmp_path)
    built = images.load(out)
    assert built.directory == out
    assert [i.role for i in built.all()] == [images.GPUSLICE, images.KUBE_SCHEDULER]
    assert built.gpuslice.reference == "ghcr.io/gpuslice/gpuslice:0.1.0"
    assert built.gpuslice.archive == out / "gpuslice-image.oci.tar"
    assert built.gpuslice.user == "65532:65532"
    assert built.kube_scheduler.reference == "registry.k8s.io/kube-scheduler:v1.34.4"
    assert built.kube_scheduler.user == ""
    assert built.kube_scheduler.layers == 1


def test_images_load_refuses_a_missing_archive_or_role(tmp_path: Path) -> None:
    out = _built_dir(tmp_path)
    (out / "kube-scheduler-image.oci.tar").unlink()
    with pytest.raises(images.ImageError, match="kube-scheduler-image.oci.tar is missing"):
        images.load(out)
    index = json.loads((out / images.INDEX).read_text())
    del index[images.KUBE_SCHEDULER]
    (out / images.INDEX).write_text(json.dumps(index))
    with pytest.raises(images.ImageError, match="no record for 'kube-scheduler'"):
        images.load(out)
    with pytest.raises(images.ImageError, match="cannot read"):
        images.load(tmp_path / "nowhere")


def test_the_index_command_refuses_bad_arguments(tmp_path: Path) -> None:
    assert imagearchive.main([str(tmp_path / "out.json")]) == 2
    assert imagearchive.main([str(tmp_path / "out.json"), "no-equals-sign"]) == 2
    assert imagearchive.main([str(tmp_path / "out.json"), f"x={tmp_path / 'missing.tar'}"]) == 1


def test_the_image_version_and_tag_follow_pyproject() -> None:
    """The Dockerfile's VERSION default and the chart's appVersion (the image tag build.sh uses) both
    equal pyproject.toml's version; build.sh refuses to build when the chart's does not."""
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert re.findall(r"^ARG VERSION=(\S+)$", dockerfile, re.MULTILINE) == [version]
    assert 'org.opencontainers.image.version="${VERSION}"' in dockerfile
    chart = (REPO_ROOT / "charts" / "gpuslice" / "Chart.yaml").read_text()
    assert re.findall(r'^appVersion:\s*"?([^"\s]+)"?\s*$', chart, re.MULTILINE) == [version]


def test_every_stage_of_the_dockerfile_starts_from_the_base_argument() -> None:
    """build.sh swaps the base with --build-arg PYTHON_IMAGE; a stage on another base would escape it."""
    lines = (REPO_ROOT / "Dockerfile").read_text().splitlines()
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert froms == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
