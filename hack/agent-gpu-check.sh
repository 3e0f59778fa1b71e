#!/usr/bin/env bash
# Check the gpuslice node agent on a real GPU machine (repository checked out, NVIDIA driver loaded).
#
#   bash hack/agent-gpu-check.sh            # about a minute; prints everything, touches no cluster
#
# Steps: (1) a Python environment with the package; (2) the raw NVML records the agent reads
# (copy them into agent/fake.py to record this machine's shape); (3) `gpuslice agent --once
# --dry-run --backend nvml` and the annotations decoded by the extender's codecs; (4) the long-
# running agent in dry-run mode for ~10 s with /metrics, /healthz and POST /refresh; (5) the NVML
# health-event thread for ~10 s. Environment: VENV (default .venv, else a new one in
# /tmp/gpuslice-agent-venv), CHECK_SECONDS (default 10), PORT (default 19400), BACKEND (default nvml;
# e.g. BACKEND=fake:h100-8 to try the script on a machine without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${CHECK_SECONDS:-10}
PORT=${PORT:-19400}
export BACKEND=${BACKEND:-nvml}
status=0

step() { printf '\n===== %s =====\n' "$*"; }

step "machine"
uname -a
command -v nvidia-smi >/dev/null && { nvidia-smi -L; nvidia-smi topo -m; } || echo "nvidia-smi not found (not needed by the agent)"

step "python environment"
PY=""
for candidate in "${VENV:-}" .venv /tmp/gpuslice-agent-venv; do
  if [ -n "$candidate" ] && [ -x "$candidate/bin/python" ] && "$candidate/bin/python" -c 'import gpuslice.agent.cli, pynvml' 2>/dev/null; then
    PY="$candidate/bin/python"; break
  fi
done
if [ -z "$PY" ]; then
  echo "no ready environment; creating /tmp/gpuslice-agent-venv (needs the package index)"
  python3 -m venv /tmp/gpuslice-agent-venv \
    && /tmp/gpuslice-agent-venv/bin/python -m pip install -q --upgrade pip \
    && { [ ! -f requirements.lock ] || /tmp/gpuslice-agent-venv/bin/python -m pip install -q -r requirements.lock; } \
    && /tmp/gpuslice-agent-venv/bin/python -m pip install -q -e . \
    && PY=/tmp/gpuslice-agent-venv/bin/python
fi
if [ -z "$PY" ]; then
  echo "FAILED: could not build a Python environment with gpuslice and nvidia-ml-py" >&2
  exit 1
fi
"$PY" -c 'import sys, pynvml, gpuslice; print(sys.version.split()[0], "nvidia-ml-py at", pynvml.__file__)'

step "raw NVML records (what agent/nvml.py reads; paste into agent/fake.py to record this shape)"
"$PY" - <<'EOF' || status=1
import msgspec
import os
from gpuslice.agent import backend, cli, collect
try:
    b = cli.open_backend(os.environ["BACKEND"])()
except backend.BackendError as e:
    raise SystemExit(f"NVML unavailable: {e.reason}: {e}")
print(b.describe())
records = collect.inventory(b)
for g in records.gpus:
    print("gpu", msgspec.json.encode(g).decode())
for g, links in zip(records.gpus, records.nvlinks):
    print(f"nvlinks of {g.index}:", msgspec.json.encode(links).decode())
for p in records.pairs:
    print("pair", msgspec.json.encode(p).decode())
for note in records.notes:
    print("note:", note)
for g in records.gpus:
    print("telemetry", msgspec.json.encode(b.telemetry(g.index)).decode())
b.close()
EOF

step "gpuslice agent --once --dry-run --register --backend $BACKEND"
"$PY" -m gpuslice agent --once --dry-run --register --backend "$BACKEND" --node-name "$(hostname)" --log-level DEBUG \
  > /tmp/gpuslice-agent-once.json || status=1
cat /tmp/gpuslice-agent-once.json

step "annotations decoded by the extender's codecs; topology-aware best sets if that policy exists"
"$PY" - <<'EOF' || status=1
import json
from gpuslice.codec import node_inventory
from gpuslice.model import nodes, requests, topology
from gpuslice.policy import registry
out = json.load(open("/tmp/gpuslice-agent-once.json"))
if out["error"]:
    raise SystemExit(f"nothing to decode: {out['error']}")
inv = node_inventory.decode_node(out["node"], out["annotations"])
for d in inv.devices:
    print(f"GPU {d.index} {d.uuid} {d.type} {d.memory_mib} MiB numa {d.numa} mode {d.mode} healthy {d.health}")
t = inv.topology
if t is not None:
    print("pair scores (HAMi) / bandwidth class:")
    for i in range(len(t.uuids)):
        print("  ", " ".join(f"{t.pair_score(i, j):5d}" if i != j else "    -" for j in range(len(t.uuids))),
              "|", " ".join(topology.bandwidth_class(t.pcie[i][j], t.nvlinks[i][j]).name[:6] if i != j else "-" for j in range(len(t.uuids))))
print("telemetry:", inv.telemetry)
if "topology-aware" in registry.names():
    policy = registry.get("topology-aware")
    state = nodes.empty_state(inv)
    for count in range(1, len(inv.devices) + 1):
        cards = policy.choose_cards(state, requests.ContainerRequest(count=count, memory_mib=1), tuple(range(len(inv.devices))), registry.EMPTY_CONTEXT)
        print(f"best {count}-GPU set: {cards}")
else:
    print("(topology-aware policy not registered in this checkout)")
EOF

step "long-running agent (dry run) for ${SECONDS_TO_RUN}s: /healthz, /metrics, POST /refresh"
"$PY" -m gpuslice agent --dry-run --register --backend "$BACKEND" --node-name "$(hostname)" \
  --refresh 5 --telemetry-interval 2 --listen "127.0.0.1:${PORT}" --health-quiet-period 30 &
agent_pid=$!
sleep 3
"$PY" - "$PORT" <<'EOF' || status=1
import sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
print("healthz:", urllib.request.urlopen(base + "/healthz", timeout=5).read().decode().strip())
print("refresh:", urllib.request.urlopen(urllib.request.Request(base + "/refresh", data=b"", method="POST"), timeout=5).status)
body = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
print("\n".join(l for l in body.splitlines() if l.startswith("gpuslice_agent_")))
EOF
sleep $((SECONDS_TO_RUN > 3 ? SECONDS_TO_RUN - 3 : 1))
kill -TERM "$agent_pid" 2>/dev/null
wait "$agent_pid"; echo "agent exit status $?"

step "NVML health events for ${SECONDS_TO_RUN}s (critical XIDs, double-bit ECC; none is expected on a healthy card)"
"$PY" - "$SECONDS_TO_RUN" <<'EOF' || status=1
import os, sys, time
from gpuslice.agent import backend, cli, health
try:
    b = cli.open_backend(os.environ["BACKEND"])()
except backend.BackendError as e:
    raise SystemExit(f"NVML unavailable: {e.reason}: {e}")
tracker = health.Tracker((g.index for g in b.gpus()), quiet_period_s=30)
w = health.Watcher(b, tracker, time.monotonic, lambda changes: [print("CHANGE", c) for c in changes], poll_s=0.5)
w.start()
print("registered for events:", w.registered, "error:", w.error)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    time.sleep(1)
w.stop()
print("health after the wait:", w.healthy())
b.close()
EOF

step "done (status $status)"
exit $status
