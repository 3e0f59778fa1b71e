"""Evictions and PodDisruptionBudgets: the API side of GPU-aware preemption (docs/preemption.md).

``evict`` asks the Eviction API (``POST pods/{name}/eviction``, ``policy/v1``) to remove a pod,
with the pod's UID as precondition, so a pod deleted and recreated under the same name is never
evicted by mistake. The apiserver checks the PodDisruptionBudgets that select the pod and refuses
with 429 when one of them allows no more disruption (or its status is not yet computed by the
disruption controller); that refusal is ``Outcome.BLOCKED``, told apart from API priority and
fairness throttling (also 429) by the apiserver's message. Unlike a plain DELETE, eviction honours
the budgets, which is what an operator who set them expects (kube-scheduler's own preemption
deletes pods and only *prefers* not to violate budgets).

``list_budgets`` reads every PodDisruptionBudget and returns them as ``policy.victims.Budget``, so
the victim selection can prefer sets no budget protects.
"""

from __future__ import annotations

import datetime as dt
import enum

import msgspec

from gpuslice.kube import client as kclient
from gpuslice.kube import errors, objects
from gpuslice.policy import victims

PDB_PATH = "/apis/policy/v1/poddisruptionbudgets"
EVICT_TIMEOUT_S = 30.0
"""An eviction whose UID precondition fails is retried by the apiserver (it retries conflicting
deletes, about 20 s) before it answers 409: the request waits that long."""
_BLOCKED_HINTS = ("disruption budget", "disruptionbudget")


class Outcome(enum.Enum):
    """What became of one eviction request."""

    EVICTED = "evicted"
    """Accepted: the pod is being deleted (its grace period runs; the kubelet finishes it)."""
    BLOCKED = "blocked"
    """Refused by a PodDisruptionBudget (429): evicting more would break the budget."""
    GONE = "gone"
    """The pod no longer exists, or is another pod now (UID precondition failed)."""
    FAILED = "failed"
    """Any other error (throttled, apiserver down, forbidden): nothing is known to have happened."""


class Result(msgspec.Struct, frozen=True):
    """An eviction's outcome and the apiserver's words."""

    outcome: Outcome
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when the pod is on its way out (evicted now, or already gone)."""
        return self.outcome in (Outcome.EVICTED, Outcome.GONE)


def eviction_body(namespace: str, name: str, uid: str) -> dict[str, object]:
    """The ``policy/v1`` Eviction object, with the pod UID as a delete precondition."""
    body: dict[str, object] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    return body


def classify(err: errors.ApiError) -> Result:
    """The outcome an API error stands for (see the module docstring)."""
    text = str(err)
    if isinstance(err, errors.TooManyRequests) and any(h in err.message.lower() for h in _BLOCKED_HINTS):
        return Result(Outcome.BLOCKED, text)
    if isinstance(err, errors.NotFound) or isinstance(err, errors.Conflict):
        return Result(Outcome.GONE, text)
    return Result(Outcome.FAILED, text)


async def evict(kube: kclient.KubeClient, namespace: str, name: str, uid: str = "") -> Result:
    """Ask the Eviction API to remove the pod; never raises an ``ApiError``."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
    try:
        await kube.request("POST", path, body=eviction_body(namespace, name, uid), timeout=EVICT_TIMEOUT_S)
    except errors.ApiError as err:
        return classify(err)
    return Result(Outcome.EVICTED)


# ----- PodDisruptionBudgets


class _Requirement(msgspec.Struct, frozen=True):
    key: str = ""
    operator: str = ""
    values: list[str] | None = None


class _Selector(msgspec.Struct, frozen=True, rename="camel"):
    match_labels: dict[str, str] | None = None
    match_expressions: list[_Requirement] | None = None


class _BudgetSpec(msgspec.Struct, frozen=True):
    selector: _Selector | None = None


class _BudgetStatus(msgspec.Struct, frozen=True, rename="camel"):
    disruptions_allowed: int = 0
    disrupted_pods: dict[str, str] | None = None


class _Budget(msgspec.Struct, frozen=True):
    metadata: objects.ObjectMeta = objects.ObjectMeta()
    spec: _BudgetSpec = _BudgetSpec()
    status: _BudgetStatus = _BudgetStatus()


_BUDGETS = msgspec.json.Decoder(objects.ObjectList[_Budget])


def _budget(b: _Budget) -> victims.Budget:
    sel = b.spec.selector
    selector = None
    if sel is not None:
        selector = victims.Selector(
            match_labels=tuple(sorted((sel.match_labels or {}).items())),
            match_expressions=tuple(
                victims.Requirement(r.key, r.operator, tuple(r.values or ()))
                for r in sel.match_expressions or ()
            ),
        )
    return victims.Budget(
        namespace=b.metadata.namespace,
        name=b.metadata.name,
        selector=selector,
        allowed=b.status.disruptions_allowed,
        disrupted=frozenset(b.status.disrupted_pods or ()),
    )


def decode_budgets(content: bytes) -> list[victims.Budget]:
    """A ``PodDisruptionBudgetList`` as budgets."""
    return [_budget(b) for b in _BUDGETS.decode(content).items]


async def list_budgets(kube: kclient.KubeClient) -> list[victims.Budget]:
    """Every PodDisruptionBudget of the cluster.

    Raises:
        errors.ApiError: the list failed.
    """
    resp = await kube.request("GET", PDB_PATH)
    return decode_budgets(resp.content)


# ----- the pods of a node, with what preemption reads (labels, priority, start)

_PODS = msgspec.json.Decoder(objects.ObjectList[objects.Pod])


def start_time(pod: objects.Pod) -> float:
    """The pod's creation time in unix seconds (0 when absent or malformed)."""
    stamp = pod.metadata.creation_timestamp
    if not stamp:
        return 0.0
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


async def pods_on_node(kube: kclient.KubeClient, node: str) -> list[objects.Pod]:
    """The pods bound to ``node``, fully decoded (labels included).

    Raises:
        errors.ApiError: the list failed.
    """
    resp = await kube.request("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
    return list(_PODS.decode(resp.content).items)
