"""Card constraints and policy overrides from pod annotations (docs/hami-compat.md section 9).

HAMi's names and gpuslice's aliases are merged: lists are united (order kept, duplicates
dropped). Unlike HAMi, list items are trimmed and empty items dropped, so ``"A100,"`` does not
match every card through its empty item.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpuslice.codec import errors, goparse, keys
from gpuslice.model import limits, requests

_WEIGHT = re.compile(r"[0-9]{1,9}", re.ASCII)


def split_list(value: str | None) -> tuple[str, ...]:
    """A comma list, items trimmed, empty items dropped."""
    if not value:
        return ()
    return tuple(item for item in (part.strip() for part in value.split(",")) if item)


def _merged(annotations: Mapping[str, str], *names: str) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for name in names:
        for item in split_list(annotations.get(name)):
            out.setdefault(item, None)
    return tuple(out)


def _optional(annotations: Mapping[str, str], name: str) -> str | None:
    value = annotations.get(name, "").strip()
    return value or None


def numa_hint(annotations: Mapping[str, str]) -> int | None:
    """The required NUMA node from ``hami.io/numa-hint``, or None when absent or empty.

    Raises:
        DecodeError: not a non-negative integer.
    """
    raw = annotations.get(keys.NUMA_HINT, "").strip()
    if not raw:
        return None
    try:
        node = goparse.parse_int(raw, 32, "Atoi")
    except ValueError as exc:
        raise errors.DecodeError(keys.NUMA_HINT, "value", f"NUMA hint must be an integer: {exc}") from None
    if node < 0:
        raise errors.DecodeError(keys.NUMA_HINT, "value", f"NUMA hint must not be negative: {node}")
    return node


def numa_bind(annotations: Mapping[str, str]) -> bool:
    """``nvidia.com/numa-bind`` as HAMi reads it: Go's ParseBool, anything unparsable is false."""
    try:
        return goparse.parse_bool(annotations.get(keys.NUMA_BIND, ""))
    except ValueError:
        return False


def selectors(annotations: Mapping[str, str]) -> requests.Selectors:
    """All card constraints of a pod.

    Raises:
        DecodeError: a malformed ``hami.io/numa-hint``.
    """
    return requests.Selectors(
        use_types=_merged(annotations, keys.USE_GPU_TYPE, keys.GPU_TYPE),
        nouse_types=_merged(annotations, keys.NOUSE_GPU_TYPE),
        use_uuids=_merged(annotations, keys.USE_GPU_UUID, keys.GPU_UUID_INCLUDE),
        nouse_uuids=_merged(annotations, keys.NOUSE_GPU_UUID, keys.GPU_UUID_EXCLUDE),
        numa_bind=numa_bind(annotations),
        numa_node=numa_hint(annotations),
        mode=_optional(annotations, keys.VGPU_MODE),
    )


def _policy(annotations: Mapping[str, str], name: str) -> str | None:
    value = _optional(annotations, name)
    if value is not None and len(value) > limits.MAX_POLICY_VALUE:
        raise errors.DecodeError(
            name, "value", f"policy is {len(value)} characters long, more than {limits.MAX_POLICY_VALUE}"
        )
    return value


def node_policy(annotations: Mapping[str, str]) -> str | None:
    """The per-pod node policy override, or None.

    Raises:
        DecodeError: longer than ``limits.MAX_POLICY_VALUE`` (no policy name is).
    """
    return _policy(annotations, keys.NODE_SCHEDULER_POLICY)


def card_policy(annotations: Mapping[str, str]) -> str | None:
    """The per-pod card policy override (possibly a comma chain), or None.

    Raises:
        DecodeError: longer than ``limits.MAX_POLICY_VALUE`` (no chain of known policies is).
    """
    return _policy(annotations, keys.GPU_SCHEDULER_POLICY)


ScoringWeights = requests.ScoringWeights


def scoring_weights(annotations: Mapping[str, str]) -> ScoringWeights | None:
    """The pod's card-score weights, or None when the annotation is absent or empty.

    Raises:
        DecodeError: not exactly ``slot=<w>,core=<w>,memory=<w>`` (any order) with non-negative
            integers and at least one positive (HAMi's ``pkg/util/device_scoring_weights.go``
            makes such a pod unschedulable; decimals such as ``1.5`` are refused as there).
    """
    raw = annotations.get(keys.DEVICE_SCORING_WEIGHTS, "").strip()
    if not raw:
        return None
    found: dict[str, float] = {}
    for item in raw.split(","):
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep or name not in ("slot", "core", "memory") or name in found or not _WEIGHT.fullmatch(value):
            raise errors.DecodeError(
                keys.DEVICE_SCORING_WEIGHTS, name or "value", f"invalid weight {item.strip()!r}"
            )
        found[name] = float(value)
    if len(found) != 3:
        missing = sorted({"slot", "core", "memory"} - found.keys())
        raise errors.DecodeError(
            keys.DEVICE_SCORING_WEIGHTS, missing[0], f"missing weights {', '.join(missing)}"
        )
    if not any(w > 0 for w in found.values()):
        raise errors.DecodeError(keys.DEVICE_SCORING_WEIGHTS, "value", "at least one weight must be positive")
    return ScoringWeights(**found)
