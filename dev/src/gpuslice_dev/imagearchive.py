"""What an OCI image-layout archive holds: its name, layers, sizes and user, for ``images.json``.

``hack/image/build.sh`` writes each image it builds as an OCI image-layout tar (``buildah push IMAGE
oci-archive:FILE``) and records, next to the archives, what this module reads from them: the
reference the image is named by (containerd's ``io.containerd.image.name`` or the OCI
``org.opencontainers.image.ref.name`` annotation of ``index.json``), the manifest digest, the layer
count, the layers' size as stored (gzip-compressed by buildah: what a registry pull would transfer)
and uncompressed (what unpacking writes), and the user the image config runs as
(https://github.com/opencontainers/image-spec/blob/main/image-layout.md, ``manifest.md``,
``config.md``). Each uncompressed layer is checked against the config's ``diff_ids``.

Standard library only: ``build.sh`` runs it with any Python 3.11 as
``python -m gpuslice_dev.imagearchive OUT.json ROLE=ARCHIVE...``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_CHUNK = 1 << 20


class ArchiveError(ValueError):
    """The archive is not a single-image OCI layout this module can read."""


def _blob(tar: tarfile.TarFile, digest: str) -> IO[bytes]:
    algorithm, _, hexdigest = digest.partition(":")
    try:
        member = tar.extractfile(f"blobs/{algorithm}/{hexdigest}")
    except KeyError:
        member = None
    if member is None:
        raise ArchiveError(f"blob {digest} missing from the archive")
    return member


def _json_blob(tar: tarfile.TarFile, digest: str) -> Any:
    with _blob(tar, digest) as f:
        return json.loads(f.read())


def _layer_size(tar: tarfile.TarFile, descriptor: Mapping[str, Any], diff_id: str) -> int:
    """The layer's uncompressed size, after checking its uncompressed digest against ``diff_id``."""
    media = str(descriptor.get("mediaType", ""))
    if media.endswith("gzip"):
        inflate: Any = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    elif media.endswith(".tar"):
        inflate = None
    else:
        raise ArchiveError(f"layer {descriptor.get('digest')}: unsupported media type {media!r}")
    digest = hashlib.sha256()
    size = 0
    with _blob(tar, str(descriptor["digest"])) as f:
        while chunk := f.read(_CHUNK):
            data = chunk if inflate is None else inflate.decompress(chunk)
            digest.update(data)
            size += len(data)
        if inflate is not None:
            tail = inflate.flush()
            digest.update(tail)
            size += len(tail)
    if f"sha256:{digest.hexdigest()}" != diff_id:
        raise ArchiveError(f"layer {descriptor['digest']}: uncompressed digest is not the config's {diff_id}")
    return size


def describe(path: Path) -> dict[str, object]:
    """The ``images.json`` record of the one image in the OCI archive at ``path``.

    Raises:
        ArchiveError: ``path`` holds no image, more than one, or a blob that does not match.
    """
    with tarfile.open(path) as tar:
        index_file = tar.extractfile("index.json")
        if index_file is None:
            raise ArchiveError(f"{path}: no index.json")
        manifests = json.loads(index_file.read()).get("manifests", [])
        if len(manifests) != 1 or manifests[0].get("mediaType") not in MANIFEST_TYPES:
            raise ArchiveError(f"{path}: expected one image manifest in index.json, found {manifests}")
        entry = manifests[0]
        annotations = entry.get("annotations") or {}
        reference = annotations.get(ANNOTATION_CONTAINERD_NAME) or annotations.get(ANNOTATION_REF_NAME)
        if not reference:
            raise ArchiveError(f"{path}: the manifest is not named in index.json")
        manifest = _json_blob(tar, str(entry["digest"]))
        config = _json_blob(tar, str(manifest["config"]["digest"]))
        layers: list[Mapping[str, Any]] = manifest["layers"]
        diff_ids: list[str] = config["rootfs"]["diff_ids"]
        if len(diff_ids) != len(layers):
            raise ArchiveError(f"{path}: {len(layers)} layers but {len(diff_ids)} diff_ids in the config")
        uncompressed = sum(
            _layer_size(tar, layer, diff) for layer, diff in zip(layers, diff_ids, strict=True)
        )
    return {
        "reference": str(reference),
        "archive": path.name,
        "digest": str(entry["digest"]),
        "layers": len(layers),
        "uncompressed_size": uncompressed,
        "compressed_size": sum(int(layer["size"]) for layer in layers),
        "user": str((config.get("config") or {}).get("User") or ""),
    }


def write_index(out: Path, archives: Mapping[str, Path]) -> dict[str, dict[str, object]]:
    """Describe each archive and write ``{role: record}`` as JSON to ``out``; returns what it wrote."""
    records = {role: describe(path) for role, path in archives.items()}
    out.write_text(json.dumps(records, indent=2, sort_keys=True) + "\n")
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """``OUT.json ROLE=ARCHIVE...``: write the index; 2 on bad arguments, 1 on an unreadable archive."""
    args = list(sys.argv[1:] if argv is None else argv)
    pairs = [arg.partition("=") for arg in args[1:]]
    if len(args) < 2 or any(not role or not sep or not file for role, sep, file in pairs):
        print("usage: python -m gpuslice_dev.imagearchive OUT.json ROLE=ARCHIVE...", file=sys.stderr)
        return 2
    try:
        write_index(Path(args[0]), {role: Path(file) for role, _, file in pairs})
    except (ArchiveError, OSError, KeyError, tarfile.TarError, zlib.error) as err:
        print(f"imagearchive: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
