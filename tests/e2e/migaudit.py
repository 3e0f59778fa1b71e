"""Audit MIG instances from the API alone: every held instance legal on its card, none overlapping.

Pure (API objects in, findings out) and independent of gpuslice's codec: the formats are read as
HAMi v2.10 writes them. A node registers its MIG cards in ``hami.io/node-nvidia-register`` with
``mode: mig`` and ``migProfiles`` (name, ``memoryMB``, ``core``, ``placements``); a pod holds
instances in ``hami.io/vgpu-mig-allocations``, one record per instance (``containerIndex``,
``deviceIndex``, ``gpuUUID``, ``profile``, ``placement{start,size}``, and after the device
plugin's ``Allocate`` ``migUUID``, ``gpuInstanceID``, ``computeInstanceID``; HAMi
``pkg/device/nvidia/mig_allocations.go``, device plugin ``annotateMigRuntimeInfo``).

A pod counts while it has not finished (phase Succeeded or Failed). Findings, one line each:

- a MIG annotation that does not decode, or a record missing a field;
- a record on a card its pod's node does not register, or on a card not in MIG mode;
- a record whose profile the card does not offer, or whose placement is not one of the profile's;
- two held instances on one card that share a memory slice (across pods or within one);
- a record with part of the runtime identity, a pod past ``Allocate`` (``bind-phase: success``)
  with a record lacking it, two instances of one card with the same GPU-instance id, or two
  instances with the same MIG UUID;
- a record that does not name its grant in ``hami.io/vgpu-devices-allocated`` (same container
  and position, same card) or whose grant's memory or cores differ from the profile's;
- a grant on a MIG card without a record (an instance nobody placed);
- a grant on a card whose mode the pod's ``nvidia.com/vgpu-mode`` does not accept (HAMi: the
  annotation's value must contain the card's mode).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

NODE_REGISTER = "hami.io/node-nvidia-register"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
ALLOCATED = "hami.io/vgpu-devices-allocated"
BIND_PHASE = "hami.io/bind-phase"
VGPU_MODE = "nvidia.com/vgpu-mode"
MODE_MIG = "mig"
TERMINATED = ("Succeeded", "Failed")
RUNTIME = ("migUUID", "gpuInstanceID", "computeInstanceID")


@dataclasses.dataclass(frozen=True)
class Profile:
    """One ``migProfiles`` entry."""

    name: str
    memory_mib: int
    cores: int
    placements: frozenset[tuple[int, int]]


@dataclasses.dataclass(frozen=True)
class Card:
    """A registered card: its node, mode and MIG profiles by name."""

    node: str
    uuid: str
    mode: str
    profiles: Mapping[str, Profile]


@dataclasses.dataclass(frozen=True)
class Instance:
    """One held instance."""

    pod: str
    gpu_uuid: str
    profile: str
    start: int
    size: int
    gpu_instance: int | None
    mig_uuid: str

    def overlaps(self, other: Instance) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def cards_of(nodes: Iterable[Mapping[str, Any]]) -> dict[str, Card]:
    """Every card registered in the JSON form, by UUID (other forms and bad values are skipped)."""
    out: dict[str, Card] = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        value = _annotations(node).get(NODE_REGISTER, "")
        if not value.lstrip().startswith("["):
            continue  # the legacy form carries no mode or profiles: no MIG card
        try:
            wire = json.loads(value)
        except ValueError:
            continue
        for d in wire or []:
            profiles = {
                str(p.get("name", "")): Profile(
                    name=str(p.get("name", "")),
                    memory_mib=int(p.get("memoryMB") or 0),
                    cores=int(p.get("core") or 0),
                    placements=frozenset(
                        (int(x.get("start") or 0), int(x.get("size") or 0)) for x in p.get("placements") or []
                    ),
                )
                for p in d.get("migProfiles") or []
            }
            uuid = str(d.get("id", ""))
            out[uuid] = Card(node=name, uuid=uuid, mode=str(d.get("mode") or ""), profiles=profiles)
    return out


def _grants(value: str) -> list[list[tuple[str, int, int]]]:
    """``vgpu-devices-allocated``: per container, (uuid, MiB, cores) per card, positions kept."""
    pieces = value.split(";")
    if pieces and pieces[-1] == "":
        pieces.pop()
    out = []
    for piece in pieces:
        row = []
        for entry in piece.split(":"):
            if "," in entry:
                f = entry.split(",")
                row.append((f[0], int(f[2]), int(f[3])))
        out.append(row)
    return out


def counted(pod: Mapping[str, Any]) -> bool:
    """True while the pod has not finished."""
    return str((pod.get("status") or {}).get("phase", "")) not in TERMINATED


def findings(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every MIG problem of one API read (see the module docstring)."""
    cards = cards_of(nodes)
    out: list[str] = []
    held: dict[str, list[Instance]] = {}
    uuids: dict[str, str] = {}
    for pod in pods:
        if not counted(pod):
            continue
        key = _key(pod)
        ann = _annotations(pod)
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        try:
            grants = _grants(ann.get(ALLOCATED, ""))
        except (ValueError, IndexError) as exc:
            grants = []
            out.append(f"pod {key}: {ALLOCATED} does not decode: {exc}")
        wanted = ann.get(VGPU_MODE)
        for row in grants:
            for uuid, _, _ in row:
                card = cards.get(uuid)
                if wanted is not None and card is not None and card.mode not in wanted:
                    out.append(f"pod {key} asked {VGPU_MODE}={wanted!r} and holds {card.mode!r} card {uuid}")
        raw = ann.get(MIG_ALLOCATIONS, "")
        records: list[Any] = []
        if raw:
            try:
                records = json.loads(raw) or []
                if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                    raise ValueError("not a list of objects")
            except ValueError as exc:
                out.append(f"pod {key}: {MIG_ALLOCATIONS} does not decode: {exc}")
                records = []
        covered: set[tuple[int, int]] = set()
        for i, r in enumerate(records):
            where = f"pod {key} MIG record {i}"
            try:
                c, d = int(r["containerIndex"]), int(r["deviceIndex"])
                uuid, profile = str(r["gpuUUID"]), str(r["profile"])
                start, size = int(r["placement"]["start"]), int(r["placement"]["size"])
            except (KeyError, TypeError, ValueError) as exc:
                out.append(f"{where}: incomplete ({exc!r})")
                continue
            covered.add((c, d))
            present = [k for k in RUNTIME if r.get(k) is not None and r.get(k) != ""]
            if present and len(present) != len(RUNTIME):
                out.append(f"{where}: partial runtime identity {present}")
            elif not present and ann.get(BIND_PHASE) == "success":
                out.append(
                    f"{where}: bind-phase success but no runtime identity (Allocate did not record it)"
                )
            card = cards.get(uuid)
            if card is None or card.node != node:
                out.append(f"{where}: card {uuid} is not registered by the pod's node {node!r}")
                continue
            if card.mode != MODE_MIG:
                out.append(f"{where}: card {uuid} is in mode {card.mode!r}, not MIG")
            prof = card.profiles.get(profile)
            if prof is None:
                out.append(f"{where}: card {uuid} offers no profile {profile!r}")
            elif (start, size) not in prof.placements:
                out.append(
                    f"{where}: {profile} at start {start} size {size} is not a legal placement on {uuid}"
                )
            if prof is not None:
                g = grants[c][d] if c < len(grants) and d < len(grants[c]) else None
                if g is None or g[0] != uuid:
                    out.append(f"{where}: container {c} device {d} of {ALLOCATED} is {g}, not card {uuid}")
                elif (g[1], g[2]) != (prof.memory_mib, prof.cores):
                    out.append(
                        f"{where}: grant {g[1]} MiB/{g[2]} cores, profile {profile} is "
                        f"{prof.memory_mib} MiB/{prof.cores} cores"
                    )
            gi = r.get("gpuInstanceID")
            mig_uuid = str(r.get("migUUID") or "")
            held.setdefault(uuid, []).append(
                Instance(key, uuid, profile, start, size, gi if isinstance(gi, int) else None, mig_uuid)
            )
            if mig_uuid:
                if mig_uuid in uuids:
                    out.append(f"{where}: MIG UUID {mig_uuid} also held by {uuids[mig_uuid]}")
                uuids[mig_uuid] = key
        for c, row in enumerate(grants):
            for d, (uuid, _, _) in enumerate(row):
                card = cards.get(uuid)
                if card is not None and card.mode == MODE_MIG and (c, d) not in covered:
                    out.append(
                        f"pod {key}: holds MIG card {uuid} (container {c} device {d}) without a MIG record"
                    )
    for uuid, instances in sorted(held.items()):
        ordered = sorted(instances, key=lambda x: (x.start, x.size))
        for k, a in enumerate(ordered):
            for b in ordered[k + 1 :]:
                if a.overlaps(b):
                    out.append(
                        f"card {uuid}: {a.pod} {a.profile}@{a.start}+{a.size} overlaps "
                        f"{b.pod} {b.profile}@{b.start}+{b.size}"
                    )
        ids: dict[int, Instance] = {}
        for x in ordered:
            if x.gpu_instance is None:
                continue
            other = ids.get(x.gpu_instance)
            if other is not None:
                out.append(f"card {uuid}: GPU instance id {x.gpu_instance} held by {other.pod} and {x.pod}")
            ids[x.gpu_instance] = x
    return out


def instances(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[Instance]]:
    """The instances counted pods hold, per card UUID (records that do not decode left out)."""
    out: dict[str, list[Instance]] = {}
    for pod in pods:
        if not counted(pod):
            continue
        try:
            records = json.loads(_annotations(pod).get(MIG_ALLOCATIONS, "") or "[]") or []
        except ValueError:
            continue
        for r in records:
            try:
                gi = r.get("gpuInstanceID")
                x = Instance(
                    _key(pod),
                    str(r["gpuUUID"]),
                    str(r["profile"]),
                    int(r["placement"]["start"]),
                    int(r["placement"]["size"]),
                    gi if isinstance(gi, int) else None,
                    str(r.get("migUUID") or ""),
                )
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            out.setdefault(x.gpu_uuid, []).append(x)
    return out
