"""The container images real nodes run, built on this machine: gpuslice's and kube-scheduler's.

No registry is reachable from the test machine, so ``hack/image/build.sh`` builds both with Debian's
buildah and writes them as OCI archives, with an ``images.json`` describing them
(``imagearchive``), into a cached directory whose path is the last line it prints:

- ``gpuslice-image.oci.tar``: the repository's ``Dockerfile`` on a Python base assembled from Debian
  bookworm's packages, named ``ghcr.io/gpuslice/gpuslice:<chart appVersion>`` as the chart's
  defaults name it;
- ``kube-scheduler-image.oci.tar``: the Go-built kube-scheduler of the control plane at
  ``/usr/local/bin/kube-scheduler``, named ``registry.k8s.io/kube-scheduler:<version>``, standing
  in for the upstream image.

A node imports each archive into its containerd (``RealNode.import_image``), after which pods name
the images as a registry pull would have left them (``imagePullPolicy: IfNotPresent`` or ``Never``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gpuslice_dev.controlplane import ControlPlaneError, built_path
from gpuslice_dev.paths import REPO_ROOT

BUILD_SCRIPT = REPO_ROOT / "hack" / "image" / "build.sh"
INSTALL_SCRIPT = REPO_ROOT / "hack" / "image" / "install.sh"
INDEX = "images.json"
OVERRIDE_ENV = "GPUSLICE_IMAGE_DIR"
"""A directory ``build.sh`` wrote earlier; when set, nothing is built."""

GPUSLICE = "gpuslice"
KUBE_SCHEDULER = "kube-scheduler"


class ImageError(RuntimeError):
    """The images could not be built, or their directory is incomplete."""


@dataclass(frozen=True)
class Image:
    """One built image: its archive and what ``images.json`` says of it."""

    role: str
    reference: str
    archive: Path
    digest: str
    layers: int
    uncompressed_size: int
    compressed_size: int
    user: str


@dataclass(frozen=True)
class BuiltImages:
    """The directory ``build.sh`` wrote and its two images."""

    directory: Path
    gpuslice: Image
    kube_scheduler: Image

    def all(self) -> tuple[Image, ...]:
        """Every image, in import order."""
        return (self.gpuslice, self.kube_scheduler)


def _image(directory: Path, role: str, record: object) -> Image:
    if not isinstance(record, dict):
        raise ImageError(f"{directory / INDEX}: no record for {role!r}")
    try:
        image = Image(
            role=role,
            reference=str(record["reference"]),
            archive=directory / str(record["archive"]),
            digest=str(record["digest"]),
            layers=int(record["layers"]),
            uncompressed_size=int(record["uncompressed_size"]),
            compressed_size=int(record["compressed_size"]),
            user=str(record["user"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ImageError(f"{directory / INDEX}: bad record for {role!r}: {err!r}") from err
    if not image.archive.is_file():
        raise ImageError(f"{directory / INDEX}: {image.archive.name} is missing")
    return image


def load(directory: Path) -> BuiltImages:
    """The images ``build.sh`` wrote to ``directory``, read from its ``images.json``.

    Raises:
        ImageError: ``images.json`` is missing or malformed, or names an archive that is not there.
    """
    try:
        records = json.loads((directory / INDEX).read_text())
    except (OSError, ValueError) as err:
        raise ImageError(f"cannot read {directory / INDEX}: {err}") from err
    if not isinstance(records, dict):
        raise ImageError(f"{directory / INDEX}: not a JSON object")
    return BuiltImages(
        directory=directory,
        gpuslice=_image(directory, GPUSLICE, records.get(GPUSLICE)),
        kube_scheduler=_image(directory, KUBE_SCHEDULER, records.get(KUBE_SCHEDULER)),
    )


def built_images() -> BuiltImages:
    """The images, from ``$GPUSLICE_IMAGE_DIR`` or else ``hack/image/build.sh``.

    ``build.sh`` returns at once when its inputs (the build context, the Debian base recipe, the
    kube-scheduler binary) are unchanged; otherwise it builds what changed (about a minute for the
    gpuslice image, plus about 40 s for the base on a cold cache), as root with buildah and
    mmdebstrap (``hack/image/install.sh``).

    Raises:
        ImageError: the build failed or its directory is incomplete.
    """
    try:
        directory = built_path(BUILD_SCRIPT, OVERRIDE_ENV)
    except ControlPlaneError as err:
        raise ImageError(str(err)) from err
    return load(directory)
