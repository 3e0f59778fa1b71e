# gpuslice server image: one image runs `gpuslice serve` (the extender), `gpuslice agent` (the node
# agent) and `gpuslice webhook` (the admission webhook); the entrypoint is `gpuslice` and the chart
# passes the subcommand as args. The chart's kube-scheduler container runs the upstream
# registry.k8s.io/kube-scheduler image, not this one.
#
#   docker build -t gpuslice:0.1.0 .
#
# Never built on the development machine or in its CI: that machine has no container runtime (no
# docker, podman or buildkit). tests/integration/test_package.py runs the same steps outside a
# container instead: the wheel built with the pinned setuptools, a fresh venv without pip, the wheel
# installed under requirements.lock, then the server commands, `pip check`, and no rich/matplotlib.
#
# The base is pinned by exact version tag, not by digest: no image can be pulled on that machine to
# read one. Where a runtime exists, append @sha256:... from
# `docker buildx imagetools inspect python:3.11.17-slim-bookworm`.
ARG PYTHON_IMAGE=python:3.11.17-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY requirements.lock ./
# The build tools (setuptools, wheel, pip) stay in /opt/build, which the final stage never copies.
RUN python -m venv /opt/build \
 && /opt/build/bin/python -m pip install --constraint requirements.lock setuptools wheel
COPY pyproject.toml README.md ./
COPY src ./src
# `pip install gpuslice` is the server install: no sim extra (rich, matplotlib). pip compiles the
# .pyc files here, so the read-only runtime never needs to write them.
RUN /opt/build/bin/python -m pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/gpuslice \
 && /opt/build/bin/python -m pip --python /opt/gpuslice/bin/python install \
      --constraint requirements.lock /wheels/gpuslice-*.whl \
 && /opt/build/bin/python -m pip --python /opt/gpuslice/bin/python check

FROM ${PYTHON_IMAGE}
ARG SOURCE_URL=https://github.com/gpuslice/gpuslice
LABEL org.opencontainers.image.title="gpuslice" \
      org.opencontainers.image.description="Kubernetes GPU scheduler extender, node agent and admission webhook: HAMi-compatible fractional GPU placement" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.version="0.1.0"
# No build tools at runtime: drop the base image's own pip/setuptools/wheel. The official image ships
# the standard library without .pyc files; compile them now so a read-only root filesystem costs no
# start-up time. The user owns nothing: HOME is /tmp, where the chart mounts an emptyDir.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
 && python -m compileall -q -j 0 -x '/(tests?|idle_test)/' /usr/local/lib/python3.11 \
 && groupadd --system --gid 65532 gpuslice \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin gpuslice
COPY --from=builder /opt/gpuslice /opt/gpuslice
ENV PATH=/opt/gpuslice/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 65532:65532
ENTRYPOINT ["gpuslice"]
CMD ["--help"]
