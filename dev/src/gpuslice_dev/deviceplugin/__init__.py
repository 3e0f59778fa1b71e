"""A device plugin on kubelet's device-plugin API (v1beta1, gRPC) that speaks HAMi's node protocol.

It plays HAMi's NVIDIA device plugin (``pkg/device-plugin/nvidiadevice/nvinternal/plugin``) next
to a real kubelet: it advertises ``nvidia.com/gpu`` as ``split-count`` replicas per card,
registers the cards on its Node (``hami.io/node-nvidia-register``, ``hami.io/node-handshake``),
and in ``Allocate`` serves the pod the node lock names: it consumes that pod's
``hami.io/vgpu-devices-to-allocate`` one container at a time, answers with HAMi-core's env, mounts
and device nodes, sets ``hami.io/bind-phase`` and releases ``hami.io/mutex.lock``
(docs: hami-protocol.md sections 6-8).

Modules: ``v1beta1`` (generated from kubelet's api.proto by hack/deviceplugin/gen.sh),
``inventory`` (cards, replica IDs, registration), ``entries`` (the annotation, consumed one
container at a time), ``podview`` (the pod fields ``Allocate`` reads), ``pending`` (which pod is
being allocated), ``responses`` (env, mounts, device specs), ``hostdirs`` (host directories),
``preferred`` (``GetPreferredAllocation``), ``allocator`` (``Allocate``), ``servicer`` (the gRPC
service), ``plugin`` (socket, registration, restarts), ``reporter`` (Node annotations),
``service`` (all of it together), ``cli``.

Cards come from the node agent's backends (``--backend nvml`` or ``fake:<shape>``); only
``agent.nvml`` touches NVML.
"""
