# gpuslice server image: one image runs `gpuslice serve` (the extender), `gpuslice agent` (the node
# agent) and `gpuslice webhook` (the admission webhook); the entrypoint is `gpuslice` and the chart
# passes the subcommand as args. The chart's kube-scheduler container runs the upstream
# registry.k8s.io/kube-scheduler image, not this one.
#
#   docker build -t ghcr.io/gpuslice/gpuslice:0.1.0 .
#
# hack/image/build.sh builds it with Debian's buildah on a base assembled from Debian bookworm's
# own packages (python3.11, python3.11-venv, python-is-python3, ca-certificates), passed as
# PYTHON_IMAGE, since no registry is reachable from the development machine; everything after FROM
# runs unchanged on either base. The node tier (tests/node/test_image.py) imports the result into
# real containerd nodes and runs it as the chart does: uid 65532, read-only root filesystem, no pip
# or compiler, every subcommand's --help, the webhook's and the agent's health routes.
#
# The default base is pinned by exact version tag, not by digest: no image can be pulled on the
# development machine to read one. Where a registry is reachable, append @sha256:... from
# `docker buildx imagetools inspect python:3.11.17-slim-bookworm`.
ARG PYTHON_IMAGE=python:3.11.17-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# The dependencies first, from pyproject.toml's [project] dependencies under the lock: this layer
# changes only with those two files, so a rebuild after a source change downloads nothing. The build
# tools (setuptools, wheel, pip) stay in /opt/build, which the final stage never copies.
COPY requirements.lock pyproject.toml ./
RUN python -m venv /opt/build \
 && /opt/build/bin/python -m pip install --constraint requirements.lock setuptools wheel \
 && python -m venv --without-pip /opt/gpuslice \
 && python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /tmp/server-requirements.txt \
 && /opt/build/bin/python -m pip --python /opt/gpuslice/bin/python install \
      --constraint requirements.lock --requirement /tmp/server-requirements.txt
COPY README.md ./
COPY src ./src
# `pip install gpuslice` is the server install: no sim extra (rich, matplotlib). pip compiles the
# .pyc files here, so the read-only runtime never needs to write them.
RUN /opt/build/bin/python -m pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/build/bin/python -m pip --python /opt/gpuslice/bin/python install \
      --constraint requirements.lock /wheels/gpuslice-*.whl \
 && /opt/build/bin/python -m pip --python /opt/gpuslice/bin/python check

FROM ${PYTHON_IMAGE}
ARG SOURCE_URL=https://github.com/gpuslice/gpuslice
# pyproject.toml's version (hack/image/build.sh passes it; a unit test keeps this default equal)
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpuslice" \
      org.opencontainers.image.description="Kubernetes GPU scheduler extender, node agent and admission webhook: HAMi-compatible fractional GPU placement" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.version="${VERSION}"
# No build tools at runtime: drop the base's own pip/setuptools/wheel where it has them (the
# official image does, Debian's python3.11 does not), and the wheels ensurepip or `python -m venv`
# would install them from (the official image's ensurepip/_bundled, Debian's /usr/share/python-wheels).
# The official image ships the standard library without .pyc files; compile them now so a read-only
# root filesystem costs no start-up time. The user owns nothing: HOME is /tmp, where the chart
# mounts an emptyDir.
RUN if python -c 'import pip' 2>/dev/null; then python -m pip uninstall --yes --quiet pip setuptools wheel; fi \
 && stdlib=$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))') \
 && rm -rf "$stdlib/ensurepip/_bundled" /usr/share/python-wheels \
 && python -m compileall -q -j 0 -x '/(tests?|idle_test)/' "$stdlib" \
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
