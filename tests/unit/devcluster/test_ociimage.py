"""The OCI image-layout writer: what containerd's ``ctr images import`` reads (the node tier imports
these archives into a real containerd; here the layout itself is checked against the spec)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from gpuslice_dev import ociimage

pytestmark = pytest.mark.unit


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        out = {}
        for m in tar.getmembers():
            f = tar.extractfile(m)
            out[m.name] = f.read() if f is not None else b""
        return out


def _blob(members: dict[str, bytes], digest: str) -> bytes:
    data = members[f"blobs/sha256/{digest.removeprefix('sha256:')}"]
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
    return data


def test_layout_is_a_valid_single_layer_image(tmp_path: Path) -> None:
    files = {
        "/bin/tool": ociimage.File(data=b"\x7fELF..."),
        "/bin/sh": ociimage.File(link="tool"),
        "/tmp": ociimage.File(directory=True, mode=0o1777),
    }
    image = ociimage.write_layout(
        tmp_path / "img.tar", "example.local/tool:1", files, entrypoint=["/bin/tool"]
    )
    members = _members(image.path)
    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(members["index.json"])
    [entry] = index["manifests"]
    assert entry["digest"] == image.digest
    assert entry["annotations"]["io.containerd.image.name"] == "example.local/tool:1"
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "1"
    manifest = json.loads(_blob(members, entry["digest"]))
    assert manifest["mediaType"] == ociimage.MEDIA_MANIFEST
    config = json.loads(_blob(members, manifest["config"]["digest"]))
    [layer_desc] = manifest["layers"]
    layer = _blob(members, layer_desc["digest"])
    # An uncompressed layer: its diff_id is the digest of the tar itself.
    assert config["rootfs"]["diff_ids"] == [layer_desc["digest"]]
    assert config["config"]["Entrypoint"] == ["/bin/tool"]
    assert (config["os"], config["architecture"]) == ("linux", "amd64")
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        entries = {m.name: m for m in tar.getmembers()}
    assert entries["bin"].isdir()  # parents are written before their children
    assert entries["bin/tool"].isfile() and entries["bin/tool"].mode == 0o755
    assert entries["bin/sh"].issym() and entries["bin/sh"].linkname == "tool"
    assert entries["tmp"].isdir() and entries["tmp"].mode == 0o1777
    assert list(entries).index("bin") < list(entries).index("bin/tool")


def test_same_files_same_digest(tmp_path: Path) -> None:
    files = {"/a": ociimage.File(data=b"x")}
    first = ociimage.write_layout(tmp_path / "1.tar", "x.local/a:1", files)
    second = ociimage.write_layout(tmp_path / "2.tar", "x.local/a:1", files)
    changed = ociimage.write_layout(tmp_path / "3.tar", "x.local/a:1", {"/a": ociimage.File(data=b"y")})
    assert first.digest == second.digest != changed.digest


def test_busybox_files_link_every_applet(tmp_path: Path) -> None:
    binary = tmp_path / "busybox"
    binary.write_bytes(b"bb")
    files = ociimage.busybox_files(binary, ["sh", "sleep", "busybox", "", "bad/name"])
    assert files["/bin/busybox"].data == b"bb"
    assert files["/bin/sh"].link == files["/bin/sleep"].link == "busybox"
    assert "/bin/bad/name" not in files and "/bin/" not in files
