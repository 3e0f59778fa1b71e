"""gpuslice's development and test harness (the ``gpuslice-dev`` distribution).

A real control plane (etcd, kube-apiserver, kube-scheduler) as local processes, fake GPU nodes with a
kubelet/device-plugin stand-in (``nodesim``), real nodes with kubelet and containerd (``realnode``),
a HAMi-compatible device plugin on kubelet's gRPC API (``deviceplugin``), the Helm runner, image
helpers, an HTTP fuzzer and a browser driver: what the tests, benchmarks and ``gpuslice-dev
dev-cluster`` run. None of it runs in a cluster, so none of it ships in the ``gpuslice`` wheel or the
container image; it is installed editable from the checkout only (``paths``), and imports
``gpuslice`` while ``gpuslice`` never imports it.
"""
