"""Mount a pod's volumes at their real paths inside a private mount namespace, as data and a script.

Each container runs as ``unshare --mount --propagation private -- /bin/sh -c SCRIPT EXE ARGS...``
(``podrun``); ``plan_mounts`` decides what SCRIPT does and ``render_script`` writes it. Nothing
reaches the host's mount table or files (``mount_namespaces(7)``):

1. a tmpfs on a scratch directory becomes the shell's working directory; every later reference
   to it is relative, so it stays reachable even when a mount hides its path;
2. each volume's host directory is bind-mounted into the scratch first (pinned), so a mount over
   e.g. ``/tmp`` cannot hide a volume that lives under ``/tmp``;
3. a mount point that does not exist needs a new directory: an overlayfs (``overlayfs(5)``) goes
   on its nearest existing ancestor, lower layer the ancestor itself, upper layer in the scratch
   tmpfs, so the directory exists only in this namespace. Mounts below the ancestor are bound
   back from a recursive bind of the original taken just before (an overlay's lower layer does
   not show them). The ancestor ``/`` is refused;
4. mount points are created and the volumes bound in order of path depth (as containerd sorts
   them), a path under an earlier mount point being created inside that volume;
5. host directories the container's program needs (``keep``: the local executable's tree, the
   repository and Python installation it runs from) are bound back at their own paths when a
   volume hides them, e.g. an ``emptyDir`` on ``/tmp`` over a checkout under ``/tmp`` (an image
   brings its own files; here they come from the host);
6. read-only mounts are remounted ``ro`` last, after everything below them exists.

Paths are resolved through symlinks first (``/var/run`` -> ``/run``), as runc resolves a mount
destination.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Literal

import msgspec

from gpuslice_dev.podenv import PodSpecError

PathKind = Literal["dir", "file", "missing"]
"""What a path is on the host (anything not a directory counts as a file)."""


class MountRequest(msgspec.Struct, frozen=True):
    """One volume mount of a container."""

    target: str
    """``mountPath`` as written (absolute)."""
    volume: str
    """Host path of the materialized volume (a directory, or a file)."""
    sub_path: str = ""
    """``subPath`` inside the volume, or ''."""
    is_file: bool = False
    """Whether the source (``volume/sub_path``) is a file."""
    read_only: bool = False


class Overlay(msgspec.Struct, frozen=True):
    """An overlayfs on an existing directory, so new mount points can be made below it."""

    path: str
    submounts: tuple[str, ...] = ()
    """Host mount points below ``path`` (outermost only) to bind back over the overlay."""


class Bind(msgspec.Struct, frozen=True):
    """Bind a volume (or a path inside it) onto ``target``."""

    target: str
    """The resolved mount point."""
    pin: int
    """Index of the pinned volume in ``MountPlan.pins``."""
    sub_path: str
    is_file: bool
    create: bool
    """Whether the mount point must be created first."""
    read_only: bool


class MountPlan(msgspec.Struct, frozen=True):
    """Everything a container's setup script mounts, in order."""

    pins: tuple[tuple[str, bool], ...]
    """(host path, is_file) of each distinct volume."""
    overlays: tuple[Overlay, ...]
    binds: tuple[Bind, ...]
    make_dirs: tuple[str, ...] = ()
    """Directories to create after the binds (a missing ``workingDir``, as runc creates it)."""


def _under(path: str, parent: str) -> bool:
    """``path`` is ``parent`` or below it."""
    return path == parent or parent == "/" or path.startswith(parent + "/")


def _depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


def _nearest_existing(path: str, kind_of: Callable[[str], PathKind], what: str) -> str:
    parent = posixpath.dirname(path)
    while True:
        kind = kind_of(parent)
        if kind == "dir":
            return parent
        if kind == "file":
            raise PodSpecError(f"{what}: {parent} is not a directory")
        parent = posixpath.dirname(parent)


def _kind_at(
    path: str, bound: Sequence[tuple[str, str]], kind_of: Callable[[str], PathKind]
) -> tuple[PathKind, bool]:
    """What ``path`` is once the earlier mounts are in place, and whether it lies in one of them."""
    inner = max((b for b in bound if _under(path, b[0])), key=lambda b: _depth(b[0]), default=None)
    if inner is None:
        return kind_of(path), False
    # Below (or at) an earlier mount point: it exists, or is created inside that volume.
    rel = posixpath.relpath(path, inner[0])
    return ("dir" if rel == "." else kind_of(posixpath.normpath(posixpath.join(inner[1], rel)))), True


def _ancestor(path: str, kind_of: Callable[[str], PathKind], what: str) -> str:
    anc = _nearest_existing(path, kind_of, what)
    if anc == "/":
        raise PodSpecError(f"{what}: its nearest existing ancestor is /, which podrun will not overlay")
    return anc


def plan_mounts(
    requests: Sequence[MountRequest],
    *,
    kind_of: Callable[[str], PathKind],
    resolve: Callable[[str], str],
    mount_points: Collection[str],
    working_dir: str = "/",
    keep: Sequence[str] = (),
) -> MountPlan:
    """Plan the mounts of one container.

    Args:
        requests: the container's volume mounts (and the service-account directory).
        kind_of: what a host path is (``os.path`` on the host; a dict lookup in tests).
        resolve: resolves symlinks in a path (``os.path.realpath``), missing tails kept.
        mount_points: the host's mount points (``/proc/self/mountinfo``).
        working_dir: the container's ``workingDir``; created (like a mount point) if missing.
        keep: host directories that must stay visible at their own paths (bound back, with
            their mount point created inside the volume, when a volume mount covers them).

    Returns:
        The plan; ``render_script`` turns it into shell.

    Raises:
        PodSpecError: a relative mount path, a mount point of the wrong type, or one whose
            nearest existing ancestor is ``/``.
    """
    resolved: list[tuple[str, MountRequest]] = []
    for req in requests:
        if not req.target.startswith("/"):
            raise PodSpecError(f"mountPath {req.target!r} must be absolute")
        resolved.append((posixpath.normpath(resolve(posixpath.normpath(req.target))), req))
    resolved.sort(key=lambda item: _depth(item[0]))  # stable, as containerd's sortMounts

    pins: dict[str, int] = {}
    pin_list: list[tuple[str, bool]] = []
    bound: list[tuple[str, str]] = []  # (mount point, host path of what is bound there)
    binds: list[Bind] = []
    ancestors: list[str] = []
    for path, req in resolved:
        source = posixpath.join(req.volume, req.sub_path) if req.sub_path else req.volume
        if req.volume not in pins:
            pins[req.volume] = len(pin_list)
            pin_list.append((req.volume, req.is_file and not req.sub_path))
        kind, inner = _kind_at(path, bound, kind_of)
        if kind != "missing" and (kind == "file") != req.is_file:
            want = "file" if req.is_file else "directory"
            raise PodSpecError(f"mountPath {req.target}: {path} exists and is not a {want}")
        create = kind == "missing"
        if create and not inner:
            ancestors.append(_ancestor(path, kind_of, f"mountPath {req.target}"))
        binds.append(Bind(path, pins[req.volume], req.sub_path, req.is_file, create, req.read_only))
        bound.append((path, source))
    for host in sorted({posixpath.normpath(resolve(k)) for k in keep}, key=_depth):
        if not any(host != target and _under(host, target) for target, _ in bound):
            continue
        if host not in pins:
            pins[host] = len(pin_list)
            pin_list.append((host, False))
        binds.append(Bind(host, pins[host], "", False, True, False))
        bound.append((host, host))
    make_dirs: list[str] = []
    if not working_dir.startswith("/"):
        raise PodSpecError(f"workingDir {working_dir!r} must be absolute")
    cwd = posixpath.normpath(resolve(posixpath.normpath(working_dir)))
    kind, inner = _kind_at(cwd, bound, kind_of)
    if kind == "file":
        raise PodSpecError(f"workingDir {working_dir}: {cwd} is not a directory")
    if kind == "missing":
        if not inner:
            ancestors.append(_ancestor(cwd, kind_of, f"workingDir {working_dir}"))
        make_dirs.append(cwd)
    return MountPlan(tuple(pin_list), _overlays(ancestors, mount_points), tuple(binds), tuple(make_dirs))


def _overlays(ancestors: Sequence[str], mount_points: Collection[str]) -> tuple[Overlay, ...]:
    """The fewest overlays covering ``ancestors`` without crossing a mount point."""
    mounts = {posixpath.normpath(m) for m in mount_points}
    chosen: list[str] = []
    for anc in sorted(set(ancestors), key=lambda p: (_depth(p), p)):
        covered = any(
            _under(anc, c) and not any(_under(anc, m) and _under(m, c) and m != c for m in mounts)
            for c in chosen
        )
        if not covered:
            chosen.append(anc)
    out = []
    for c in chosen:
        below = [m for m in mounts if m != c and _under(m, c)]
        outer = sorted(m for m in below if not any(o != m and _under(m, o) for o in below))
        out.append(Overlay(c, tuple(outer)))
    return tuple(out)


def render_script(
    plan: MountPlan,
    *,
    scratch: str,
    tools: Mapping[str, str],
    working_dir: str,
    env: Mapping[str, str],
    hostname: str | None = None,
) -> str:
    """The ``sh -c`` script that mounts the plan and execs the container (``"$0" "$@"``).

    It writes ``ok`` to its stdin (a pipe ``podrun`` reads: setup done) just before the
    ``exec``, which replaces stdin with ``/dev/null``. The container's environment is set by
    ``env -i`` at the ``exec``, so the shell neither adds (``PWD``) nor drops (names that are not
    shell identifiers, e.g. ``CONF_app.yaml`` from ``envFrom``) variables, and the setup commands
    do not run under it.

    Args:
        plan: from ``plan_mounts``.
        scratch: a host directory for the namespace's tmpfs (empty, not a mount point).
        tools: absolute paths of ``mount``, ``mkdir``, ``touch``, ``env`` and (with ``hostname``)
            ``hostname``.
        working_dir: the container's ``workingDir``.
        env: the container's environment.
        hostname: set this host name (inside a new UTS namespace), or None.

    Returns:
        The script.
    """
    q = shlex.quote
    mount, mkdir, touch = q(tools["mount"]), q(tools["mkdir"]), q(tools["touch"])
    lines = ["set -eu"]
    if hostname is not None:
        lines.append(f"{q(tools['hostname'])} {q(hostname)}")
    lines += [f"{mount} -t tmpfs -o mode=0700 gpuslice-podrun {q(scratch)}", f"cd {q(scratch)}"]
    for i, (host, is_file) in enumerate(plan.pins):
        lines.append(f"{touch} p{i}" if is_file else f"{mkdir} p{i}")
        lines.append(f"{mount} --bind {q(host)} p{i}")
    for j, ov in enumerate(plan.overlays):
        o = f"o{j}"
        lines.append(f"{mkdir} {o} {o}/l {o}/u {o}/w")
        lines.append(f"{mount} --rbind {q(ov.path)} {o}/l")
        lines.append(
            f"{mount} -t overlay overlay -o lowerdir={o}/l,upperdir={o}/u,workdir={o}/w {q(ov.path)}"
        )
        for sub in ov.submounts:
            rel = posixpath.relpath(sub, ov.path)
            lines.append(f"{mount} --rbind {q(f'{o}/l/{rel}')} {q(sub)}")
    for b in plan.binds:
        if b.create and b.is_file:
            lines.append(f"{mkdir} -p {q(posixpath.dirname(b.target))}")
            lines.append(f"{touch} {q(b.target)}")
        elif b.create:
            lines.append(f"{mkdir} -p {q(b.target)}")
        source = f"p{b.pin}/{b.sub_path}" if b.sub_path else f"p{b.pin}"
        lines.append(f"{mount} --bind {q(source)} {q(b.target)}")
    for d in plan.make_dirs:
        lines.append(f"{mkdir} -p {q(d)}")
    for b in plan.binds:
        if b.read_only:
            lines.append(f"{mount} -o remount,bind,ro {q(b.target)}")
    lines.append(f"cd {q(working_dir)}")
    lines.append("printf ok >&0")
    assignments = " ".join(q(f"{name}={value}") for name, value in env.items())
    lines.append(f'exec {q(tools["env"])} -i -- {assignments} "$0" "$@" </dev/null')
    return "\n".join(lines) + "\n"
