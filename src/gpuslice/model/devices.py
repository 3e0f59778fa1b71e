"""One physical GPU as a node registers it (HAMi's ``DeviceInfo``), after memory/core scaling."""

from __future__ import annotations

import msgspec

from gpuslice.model import mig

VENDOR_NVIDIA = "NVIDIA"
"""The vendor keyword HAMi writes into pod device annotations (never the model name)."""

MODE_HAMI_CORE = "hami-core"
MODE_MIG = "mig"
MODE_MPS = "mps"

FULL_CORES = 100
"""Core capacity of one unscaled card, in percent of its SMs."""


class GpuDevice(msgspec.Struct, frozen=True, kw_only=True):
    """A registered GPU.

    Attributes:
        uuid: NVML UUID, e.g. ``GPU-0fc3eda5-...``.
        index: NVML device number on its node.
        type: model name as registered, e.g. ``NVIDIA A100-SXM4-80GB``.
        memory_mib: registered memory (``devmem``), already multiplied by memory scaling.
        cores: registered core capacity (``devcore``), 100 x core scaling.
        split_count: slots, the most tasks that may share the card (``count``).
        numa: NUMA node of the card (negative values are registered as 0).
        mode: ``hami-core``, ``mig`` or ``mps``.
        health: False when the device plugin or the agent saw a device fault.
        mig_profiles: for a card in MIG mode, the GPU-instance profiles it offers (``migProfiles``);
            empty otherwise.
    """

    uuid: str
    index: int = 0
    type: str = ""
    memory_mib: int = 0
    cores: int = FULL_CORES
    split_count: int = 10
    numa: int = 0
    mode: str = MODE_HAMI_CORE
    health: bool = True
    mig_profiles: tuple[mig.Profile, ...] = ()

    @property
    def is_mig(self) -> bool:
        """True for a card in MIG mode: pods get GPU instances on it, not shares."""
        return self.mode == MODE_MIG
