"""Single-layer OCI images written as an OCI image-layout tar, for nodes that reach no registry.

The test nodes run containerd with no registry in reach, so every image they run (the sandbox's
pause image, the test workload image) is built here from files on this machine and imported with
``ctr -n k8s.io images import``. The archive follows the OCI image-layout specification
(https://github.com/opencontainers/image-spec/blob/main/image-layout.md): ``oci-layout``,
``index.json`` naming the image in the ``io.containerd.image.name`` and
``org.opencontainers.image.ref.name`` annotations, and ``blobs/sha256/`` holding one
uncompressed layer, the image config and the manifest
(https://github.com/opencontainers/image-spec/blob/main/manifest.md, ``config.md``).

The archive is deterministic: the same files give the same digests, so a node can skip an
import whose digest containerd already holds.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"


class File(msgspec.Struct, frozen=True):
    """One entry of the layer: a regular file (``data``), or a symlink (``link``), or a directory."""

    data: bytes | None = None
    mode: int = 0o755
    link: str | None = None
    directory: bool = False


class Image(msgspec.Struct, frozen=True):
    """What ``write_layout`` wrote: the image's name and its manifest digest."""

    name: str
    digest: str
    path: Path


def _layer(files: Mapping[str, File]) -> bytes:
    """An uncompressed tar of ``files`` with fixed owners and times, parents before children."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for path in sorted(files):
            parts = path.strip("/").split("/")
            for depth in range(1, len(parts)):
                parent = "/".join(parts[:depth])
                if parent not in dirs and parent not in files:
                    dirs.add(parent)
                    info = tarfile.TarInfo(parent)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            entry = files[path]
            info = tarfile.TarInfo(path.strip("/"))
            info.mode = entry.mode
            if entry.directory:
                dirs.add(path.strip("/"))
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.link
                tar.addfile(info)
            else:
                data = entry.data or b""
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def write_layout(
    path: Path,
    name: str,
    files: Mapping[str, File],
    *,
    entrypoint: Sequence[str] = (),
    cmd: Sequence[str] = (),
    env: Sequence[str] = ("PATH=/bin:/usr/bin:/sbin:/usr/sbin",),
) -> Image:
    """Write a one-layer linux/amd64 image holding ``files`` as an OCI image-layout tar at ``path``.

    Args:
        path: The archive to write (replaced atomically).
        name: Image reference, e.g. ``gpuslice.local/pause:1``; pods name it with
            ``imagePullPolicy: Never``.
        files: Absolute paths in the image to their entries.
        entrypoint: The image's ``Entrypoint``.
        cmd: The image's ``Cmd``.
        env: The image's environment.
    """
    layer = _layer(files)
    config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": list(entrypoint) or None, "Cmd": list(cmd) or None, "Env": list(env)},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": _digest(layer), "size": len(layer)}],
        }
    )
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rpartition(":")[2],
                    },
                }
            ],
        }
    )
    tmp = path.with_name(path.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        members: list[tuple[str, bytes]] = [
            ("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
            ("index.json", index),
        ]
        members += [(f"blobs/sha256/{_digest(b)[7:]}", b) for b in (layer, config, manifest)]
        for member, blob in members:
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(blob), 0o644
            tar.addfile(info, io.BytesIO(blob))
    tmp.replace(path)
    return Image(name=name, digest=_digest(manifest), path=path)


def pause_files(pause_binary: Path) -> dict[str, File]:
    """The pause image: the static pause binary alone."""
    return {"/pause": File(data=pause_binary.read_bytes())}


def busybox_files(busybox: Path, applets: Sequence[str]) -> dict[str, File]:
    """A workload image: a static busybox and a symlink per applet in ``/bin``, plus ``/tmp``."""
    files = {"/bin/busybox": File(data=busybox.read_bytes())}
    for applet in applets:
        if applet and "/" not in applet and applet != "busybox":
            files[f"/bin/{applet}"] = File(link="busybox")
    files["/tmp"] = File(directory=True, mode=0o1777)
    files["/etc/passwd"] = File(data=b"root:x:0:0:root:/root:/bin/sh\n", mode=0o644)
    return files
