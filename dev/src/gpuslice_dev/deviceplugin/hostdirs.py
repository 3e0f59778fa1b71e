"""The host directories ``Allocate`` hands out: created as HAMi's plugin and its init script do.

At start, HAMi's DaemonSet copies ``libvgpu.so`` and ``ld.so.preload`` into the host's
``/usr/local/vgpu`` (the chart's ``vgpu-init.sh`` postStart hook). gpuslice's plugin does not ship
HAMi-core, so it creates empty placeholders where those files are missing (an empty
``ld.so.preload`` preloads nothing) and never replaces existing ones; a node that has the real
library keeps it. Per container, ``Allocate`` recreates ``<hami-dir>/containers/<uid>_<name>``
(mode 0777) and makes sure the shared lock dir exists (0777), as HAMi does.
"""

from __future__ import annotations

import logging
import os
import shutil

from gpuslice_dev.deviceplugin import responses

log = logging.getLogger(__name__)

PLACEHOLDERS = ("libvgpu.so", "ld.so.preload")
_OPEN_MODE = 0o777


def prepare(paths: responses.Paths) -> list[str]:
    """Create ``hami_dir``, its placeholder files and the lock dir; returns the files created."""
    os.makedirs(paths.hami_dir, exist_ok=True)
    created: list[str] = []
    for name in PLACEHOLDERS:
        path = os.path.join(paths.hami_dir, name)
        if not os.path.exists(path):
            with open(path, "x", encoding="utf-8"):
                pass
            created.append(path)
    _open_dir(paths.lock_dir)
    if created:
        log.info("created placeholders %s (no HAMi-core library on this host)", ", ".join(created))
    return created


def prepare_container(paths: responses.Paths, pod_uid: str, container: str) -> str:
    """A fresh, world-writable shared-cache dir for one container, and the lock dir; returns the former.

    Raises:
        OSError: the directories cannot be made.
    """
    path = paths.cache_dir(pod_uid, container)
    shutil.rmtree(path, ignore_errors=True)
    _open_dir(path)
    _open_dir(paths.lock_dir)
    return path


def exists(path: str) -> bool:
    """Whether a host path exists (device nodes, the license file)."""
    return os.path.exists(path)


def _open_dir(path: str) -> None:
    os.makedirs(path, mode=_OPEN_MODE, exist_ok=True)
    os.chmod(path, _OPEN_MODE)
