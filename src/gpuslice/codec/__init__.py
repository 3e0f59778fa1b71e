"""Pure codecs for HAMi's annotations and Kubernetes request parsing (no I/O, no clock).

Modules, imported as modules (``from gpuslice.codec import registrations``):

* ``keys``: every annotation key gpuslice reads or writes.
* ``errors``: ``DecodeError``, the only exception a decoder raises for malformed input.
* ``registrations``: ``hami.io/node-nvidia-register`` (JSON and legacy colon format).
* ``topology``: HAMi pair scores and gpuslice's ``gpuslice.io/gpu-topology`` matrices.
* ``telemetry``: ``gpuslice.io/gpu-telemetry``.
* ``node_inventory``: a node's annotations as a ``NodeInventory``.
* ``pod_devices``: ``hami.io/vgpu-devices-*``, the bind annotation set, allocation rebuild.
* ``locks``: ``hami.io/mutex.lock`` values, ownership and expiry.
* ``handshake``: ``hami.io/node-handshake`` and HAMi's NVIDIA node-health rule.
* ``quantity``: Kubernetes resource quantities.
* ``resources``: HAMi's ``GenerateResourceRequests``, the webhook rules, ``parse_pod``, quotas.
* ``pod_selectors``: card selectors and policy overrides from pod annotations.
* helpers: ``goparse`` (Go strconv rules), ``instants`` (``now`` and RFC 3339), ``podspec``.
"""
