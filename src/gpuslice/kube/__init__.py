"""All Kubernetes API I/O of gpuslice (the only package that imports lightkube).

- ``client``: ``KubeClient`` (kubeconfig / in-cluster, QPS+burst limiter, timeouts, raw JSON).
- ``errors``: our error hierarchy, retry intent in the type.
- ``objects`` / ``kinds``: msgspec Structs with only the fields we read; watchable kinds.
- ``informer``: list+watch with bookmarks, relist+diff on 410, resync.
- ``sync``: Node / Pod / ResourceQuota informers feeding the ``ClusterCache``.
- ``binding``, ``pods``, ``locks``: the bind path (raw Binding POST, annotation patches, HAMi's
  node lock by compare-and-swap).
- ``events``: a de-duplicating, rate-limited ``events.k8s.io/v1`` recorder.
- ``lease``: Lease leader election.
- ``nodes``: the node agent's synchronous Node calls.
- ``tlsfiles`` (with ``x509``): the serving certificates of ``gpuslice serve`` and ``gpuslice
  webhook``, reloaded when their files change, their expiry exported. Not API I/O, but both
  servers use it and this is the lowest layer doing I/O they both stand on.
"""
