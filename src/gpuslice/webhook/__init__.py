"""The admission webhook (``gpuslice webhook``): default and validate GPU pods at create time.

Two AdmissionReview routes (``admission.k8s.io/v1``; ``v1beta1`` reviews, which HAMi registers,
are answered in ``v1beta1``):

* ``POST /webhook`` (mutating): sets ``spec.schedulerName`` to gpuslice's scheduler profile and
  applies HAMi's resource defaults (the default card count, 100 cores for an exclusive whole
  card) as an RFC 6902 JSON patch (``mutate``).
* ``POST /validate`` (validating): refuses out-of-range or non-integer GPU amounts, counts no
  registered node can hold, unknown policy annotations, malformed scoring weights, a preset
  ``spec.nodeName`` and optionally privileged containers (``validate``).

Modules: ``review`` (wire structs, decisions, JSON patch), ``gpupod`` (which pods are GPU pods,
container walks), ``mutate`` and ``validate`` (pure decisions), ``capacity`` (node informer
keeping the largest registered card count), ``metrics``, ``config`` (settings), ``app``
(starlette), ``serve`` (the subcommand).

API access: nodes get/list/watch only (``capacity``); the webhook never writes to the API.
"""
