# gpuslice: `make run` and `make test` work on a fresh machine (Python 3.11+, Go for the control plane).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
POLICIES ?= random,dotprod,clustering,packing,bestfit,fgd,fgd-lookahead
SEEDS ?= 42-51
# the policies that learn their target workload, run first as a scheduler runs them (online: learned
# from the requests seen so far; docs/workload.md)
ONLINE_POLICIES ?= fgd,fgd-lookahead
# the replay with departures after the benchmark (second table, plot panels): offered loads of 80-95 %
# of GPU capacity, and saturation, where the policies part; docs/replay.md
REPLAY_POLICIES ?= binpack,bestfit,fgd,fgd-lookahead
REPLAY_SEEDS ?= 42-43
REPLAY_LOADS ?= 0.8,0.9,0.95,1.0

.PHONY: run test venv lint typecheck test-unit test-integration test-e2e test-chaos test-node test-install node image control-plane coscheduling helm chromium chart-docs bench clean

venv: $(STAMP)

# gpuslice, then the development harness gpuslice-dev (dev/: the control plane, nodes, device plugin
# and images the tests run), editable from this checkout: it never ships in the wheel or the image
$(STAMP): pyproject.toml dev/pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m pip install -q --no-deps -e dev
	touch $(STAMP)

run: $(STAMP)
	mkdir -p out
	$(PY) -m gpuslice simulate --policy $(ONLINE_POLICIES) --seeds $(SEEDS) --tune 1.3 --workload online
	$(PY) -m gpuslice simulate --policy $(POLICIES) --seeds $(SEEDS) --tune 1.3 --plot out/allocation.png \
	  --replay-policy $(REPLAY_POLICIES) --replay-seeds $(REPLAY_SEEDS) --load $(REPLAY_LOADS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src dev/src tests bench
	$(VENV)/bin/ruff format --check src dev/src tests bench
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit -m unit -q

control-plane:
	bash hack/control-plane/build.sh

# kube-scheduler built with scheduler-plugins' Coscheduling (the gang tests run beside it)
coscheduling: control-plane
	bash hack/coscheduling/build.sh

# helm for the chart tests, built from the Go module proxy at a pinned version (cached like the control plane)
helm:
	bash hack/helm/build.sh

# README's values table from charts/gpuslice/values.yaml (tests/integration/test_chart.py checks it)
chart-docs: $(STAMP)
	$(PY) -m gpuslice_dev.chartvalues charts/gpuslice/values.yaml README.md

test-integration: $(STAMP) control-plane helm
	GPUSLICE_CONTROL_PLANE_BIN=$$(bash hack/control-plane/build.sh | tail -1) \
	GPUSLICE_HELM=$$(bash hack/helm/build.sh | tail -1) \
	  $(PY) -m pytest tests/integration -m integration -q

# Debian's chromium for the cluster view's browser test (tests/e2e/test_ui_browser.py, which fails
# without it): installed only when /usr/bin/chromium is missing and we are root
chromium:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; fi

test-e2e: $(STAMP) control-plane coscheduling helm chromium
	GPUSLICE_CONTROL_PLANE_BIN=$$(bash hack/control-plane/build.sh | tail -1) \
	GPUSLICE_COSCHEDULING_BIN=$$(bash hack/coscheduling/build.sh | tail -1) \
	GPUSLICE_HELM=$$(bash hack/helm/build.sh | tail -1) \
	  $(PY) -m pytest tests/e2e -m e2e -q

test-chaos: $(STAMP) control-plane
	GPUSLICE_CONTROL_PLANE_BIN=$$(bash hack/control-plane/build.sh | tail -1) \
	  $(PY) -m pytest tests/chaos -m chaos -q

# Real nodes: Debian's containerd, runc and CNI plugins (installed when missing, as root), kubelet
# and a static pause binary built and cached like the control plane (hack/node)
node:
	bash hack/node/install.sh
	bash hack/node/build.sh

# Container images for real nodes: Debian's buildah and mmdebstrap (installed when missing, as root),
# the gpuslice image from the Dockerfile on a Python base assembled from Debian bookworm's packages,
# and a kube-scheduler image from the control plane's binary; OCI archives cached by a hash of their
# inputs (hack/image)
image: $(STAMP) control-plane
	bash hack/image/install.sh && bash hack/image/build.sh

test-node: $(STAMP) control-plane node image
	GPUSLICE_CONTROL_PLANE_BIN=$$(bash hack/control-plane/build.sh | tail -1) \
	GPUSLICE_NODE_BIN=$$(bash hack/node/build.sh | tail -1) \
	GPUSLICE_IMAGE_DIR=$$(bash hack/image/build.sh | tail -1) \
	  $(PY) -m pytest tests/node -m node -q

# The chart installed with helm onto real nodes (tests/install): the same nodes as test-node, plus
# kube-controller-manager, kube-proxy and a default kube-scheduler, and both images imported
test-install: $(STAMP) control-plane node image helm
	GPUSLICE_CONTROL_PLANE_BIN=$$(bash hack/control-plane/build.sh | tail -1) \
	GPUSLICE_NODE_BIN=$$(bash hack/node/build.sh | tail -1) \
	GPUSLICE_IMAGE_DIR=$$(bash hack/image/build.sh | tail -1) \
	GPUSLICE_HELM=$$(bash hack/helm/build.sh | tail -1) \
	  $(PY) -m pytest tests/install -m install -q

test: lint typecheck test-unit test-integration test-e2e test-chaos test-node test-install

# Benchmarks report medians and ratios from one run on this machine; results go to out/.
bench: $(STAMP) control-plane
	mkdir -p out
	$(PY) bench/bench_filter.py
	$(PY) bench/bench_sim.py
	GPUSLICE_CONTROL_PLANE_BIN=$$(bash hack/control-plane/build.sh | tail -1) $(PY) bench/bench_extender.py all
	GPUSLICE_CONTROL_PLANE_BIN=$$(bash hack/control-plane/build.sh | tail -1) $(PY) bench/bench_fidelity.py

clean:
	rm -rf $(VENV) out
