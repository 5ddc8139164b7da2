# The operator image: `lumigo-operator run` (the manager) and `lumigo-operator uninstall` (the
# Helm pre-delete hook). Slim, non-root, no shell needed at run time, and every dependency
# verified against the hashes in requirements-runtime.lock.
#   docker build -t quay.io/lumigo/lumigo-operator:v0.1.0 .
# The autotrace image (the init container added to traced pods) is built from injector/Dockerfile.
# PYTHON_IMAGE: any image with CPython 3.11 as `python3` and its venv module; hack/build-images
# passes a Debian bookworm base it builds with mmdebstrap, so nothing is pulled on a test machine.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/lumigo-operator
WORKDIR /src
COPY requirements-runtime.lock ./
RUN /opt/lumigo-operator/bin/pip install --require-hashes --no-deps -r requirements-runtime.lock
COPY pyproject.toml README.md ./
COPY kube/ kube/
COPY api/ api/
COPY webhook/ webhook/
COPY controller/ controller/
# Build with the hash-pinned setuptools, then drop the build tools from the runtime environment and
# precompile: the root filesystem is read-only in the pod.
RUN /opt/lumigo-operator/bin/pip install --no-deps --no-build-isolation . \
 && /opt/lumigo-operator/bin/pip uninstall -y -q setuptools pip \
 && /opt/lumigo-operator/bin/python -m compileall -q /opt/lumigo-operator

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="Lumigo Kubernetes operator" \
      org.opencontainers.image.description="Traces the Python and Node.js workloads of a namespace with Lumigo" \
      org.opencontainers.image.vendor="Lumigo" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/lumigo-io/lumigo-kubernetes-operator"
COPY --from=build /opt/lumigo-operator /opt/lumigo-operator
ENV PATH=/opt/lumigo-operator/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# A numeric non-root user, so that `runAsNonRoot: true` can be verified by the kubelet.
USER 65532:65532
ENTRYPOINT ["lumigo-operator", "run"]
