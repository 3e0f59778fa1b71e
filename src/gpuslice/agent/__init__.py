"""The node agent (``gpuslice agent``), run as a DaemonSet on every GPU node.

It reads the node's GPUs through NVML and publishes, on its own Node:

- ``hami.io/node-nvidia-score``: HAMi's pair scores (PCIe level + 100 per NVLink; 0 for a pair
  whose cards count different links, with an ``AsymmetricGPUP2PLink`` Warning);
- ``gpuslice.io/gpu-topology``: NVLink counts, PCIe levels, P2P and NUMA per card;
- ``gpuslice.io/gpu-telemetry``: temperature, power against limit, memory in use, utilisation,
  sampled every ``--telemetry-interval`` and patched only on a material change or when stale;
- with ``--register``, ``hami.io/node-nvidia-register`` (split count, memory and core scaling),
  for clusters that do not run HAMi's device plugin; unhealthy cards are registered
  ``health: false``. A card in MIG mode registers as HAMi's device plugin does (``register.go``):
  mode ``mig``, its GPU-instance profiles (``migProfiles``, read from NVML, or the ones
  ``--mig-profiles`` allows), count = the most instances of a profile, 100 cores, no scaling.

Critical XIDs, double-bit ECC and lost GPUs mark a card unhealthy (application XIDs 13, 31, 43,
45 and 68 do not) and raise a ``GPUUnhealthy`` Warning event on the Node; after a quiet period the
card is healthy again (``GPURecovered``). Without NVML the agent says so (log, ``NVMLUnavailable``
event, ``/healthz`` text, ``gpuslice_agent_nvml_up 0``), keeps what is published and retries.

The agent owns a node annotation key only if no other field manager wrote it (``ownership``, from
the Node's ``metadata.managedFields``; the agent writes as ``gpuslice-agent``). A key another
component owns, e.g. the pair scores of HAMi's device plugin, is neither written nor deleted:
one warning, an ``AnnotationOwnedElsewhere`` Warning event, ``gpuslice_agent_annotation_yielded``
1 for that key. ``--register`` next to a registering HAMi device plugin is refused the same way
(``RegistrationRefused``, ``gpuslice_agent_registration_refused 1``, ``/healthz`` text) and the
agent keeps publishing the rest. Once the other writer deletes the key, the agent takes it again.

Modules: ``backend`` (records and the ``Backend`` protocol), ``nvml`` (the only importer of
``pynvml``), ``fake`` (recorded machine shapes), ``collect`` (walk a backend), ``discover`` (pure:
records to model objects), ``health`` (XID rules, tracker, event thread), ``publish`` (pure:
annotation values and patches), ``ownership`` (pure: which keys the agent may write), ``metrics``,
``server`` (``/metrics``, ``/healthz``, ``POST /refresh``), ``service`` (the loop), ``cli``.

API access (``gpuslice.kube.nodes``): get and patch its Node, create ``events.k8s.io`` Events in
``default``.
"""
