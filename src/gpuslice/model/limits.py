"""The largest values gpuslice accepts from a request or a registration, checked where each is decoded.

Every number that enters the placement arithmetic (the filter's numpy columns, FGD's tables, sums
over a node's cards and a cluster's nodes) has a bound here, and so does every string the
extender may keep between calls (memo keys, event keys). The decoders refuse what lies outside
with a ``DecodeError`` naming the field, so a value past a bound never reaches a policy, the
cache or the learned workload.

Each numeric bound is far above any real machine, so a value beyond it could never fit anywhere
and refusing it changes no placement; inside the bounds every sum gpuslice forms stays far inside
int64 (1024 cards x 2**31 MiB per card, 2**17 nodes x 2**40 millicores, each below 2**62).
String bounds are Kubernetes' own, so no object the API server accepted is refused.
"""

from __future__ import annotations

INT32_MAX = 2**31 - 1
"""HAMi's registration fields and device annotations are Go ``int32``."""

MAX_CPU_MILLI = 2**40
"""Host CPU of one container, one pod or one node's allocatable, in millicores (about 1.1e9 cores)."""

MAX_MEMORY_MIB = 2**40
"""Host memory of one container, one pod or one node's allocatable, in MiB (1 EiB)."""

MAX_CARDS = 1024
"""Cards one node registers, and cards one container asks for: no node has more (a DGX has 8 or 16)."""

MAX_CARD_MEMORY_MIB = INT32_MAX
"""Memory of one card in MiB, registered or asked for (HAMi's int32 ``devmem``; 2 PiB)."""

MAX_NVLINKS = 64
"""NVLink links between two cards (NVLink 5 gives a B200 18 in all)."""

MAX_PAIR_SCORE = 100 * MAX_NVLINKS + 99
"""A HAMi pair score (``hami.io/node-nvidia-score``: 100 per NVLink link plus a PCIe level's score)."""

MAX_CARD_CORES = INT32_MAX
"""Cores (percent of a card's SMs) registered or asked for per card (HAMi's int32 ``devcore``)."""

MAX_SHAPE_CARDS = 1 << 20
"""Cards of one learned workload shape: a pod's app containers, each within ``MAX_CARDS``."""

MAX_SHAPE_SHARE = 1000
"""Per-card share of one learned workload shape in milli-GPU: a whole card (a request's share is
capped there, ``policy.shares.request_share``)."""

MAX_ANNOTATION_BYTES = 256 * 1024
"""Total size of a pod's annotations (keys and values): Kubernetes' ``TotalAnnotationSizeLimitB``
(``k8s.io/apimachinery/pkg/api/validation/objectmeta.go``)."""

MAX_NAME = 253
"""A pod or node name (a DNS subdomain: ``IsDNS1123Subdomain``, ``DNS1123SubdomainMaxLength``)."""

MAX_NAMESPACE = 63
"""A namespace (a DNS label: ``DNS1123LabelMaxLength``)."""

MAX_UID = 253
"""A UID or resourceVersion: the API server writes UUIDs (36 characters) and etcd revisions (at
most 20 digits); any longer value did not come from it."""

MAX_POLICY_VALUE = 253
"""A per-pod policy annotation (``hami.io/gpu-scheduler-policy``, ``hami.io/node-scheduler-policy``):
a chain of every card policy gpuslice knows is far shorter."""
