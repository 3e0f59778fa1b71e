"""Scheduler-side settings that change how requests are read (HAMi's ``nvidia:`` config block)."""

from __future__ import annotations

import msgspec


class ResourceNames(msgspec.Struct, frozen=True, kw_only=True):
    """Extended-resource names a pod uses to ask for GPUs."""

    count: str = "nvidia.com/gpu"
    memory: str = "nvidia.com/gpumem"
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    cores: str = "nvidia.com/gpucores"
    priority: str = "nvidia.com/priority"


class RequestConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How container resources become a ``ContainerRequest``.

    Attributes:
        names: resource names.
        memory_factor: multiplies ``gpumem`` (and quota limits).
        default_memory: MiB when neither gpumem nor a percentage is given; 0 = whole card.
        default_cores: cores when gpucores is absent; 0 = no SM limit.
        default_gpu_num: count added when only memory/cores/percentage is given (webhook rule).
        exclusive_whole_card: apply the webhook's rule that a bare ``nvidia.com/gpu`` (whole-card
            memory, no cores) asks for 100 cores, i.e. an exclusive card. gpuslice applies it at
            parse time so pods behave the same with or without the mutating webhook.
    """

    names: ResourceNames = ResourceNames()
    memory_factor: int = 1
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    exclusive_whole_card: bool = True


DEFAULT_REQUEST_CONFIG = RequestConfig()
