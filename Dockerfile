# dra-guard's container image: `dra-guard serve` on a slim Python base, as a non-root user.
#
#   docker build -t <registry>/dra-guard:0.2.0 .
#
# Stage 1 builds the wheels (dra-guard and every dependency) and installs them into a virtualenv;
# stage 2 copies only that virtualenv onto a fresh slim base: no compiler, no pip, no sources.
# The bases are pinned by version (bump both defaults together; add @sha256:... to pin the digest).
#
# Both bases are build arguments, so the image can be built without a registry from bases made
# locally (tests/e2e/image.py: Debian 12 packages put together by mmdebstrap, built with buildah):
#   BUILD_BASE  the build stage: python3 with the venv module (ensurepip), e.g. Debian's python3-venv
#   BASE        the final stage: python3 alone (no pip, no ensurepip, no compiler)
# Any pair works whose python3 is at the same path in both (the venv links to it) and >= 3.11.
ARG BUILD_BASE=python:3.11.13-slim-bookworm
ARG BASE=python:3.11.13-slim-bookworm

FROM ${BUILD_BASE} AS build
# Optional: a private index, or the CA bundle of a TLS-intercepting egress proxy (mount the file with
# `buildah bud -v BUNDLE:/run/pip-ca.crt:ro --build-arg PIP_CERT=/run/pip-ca.crt`); build stage only.
ARG PIP_INDEX_URL
ARG PIP_CERT
# A development build names its commit in `dra-guard --version` ("0.2.0+g1234abc"): the build
# context has no .git, so the builder passes it (hack/release.py leaves it empty for a release).
#   VCS_REF    the commit (hex digits), VCS_DIRTY  true when the work tree had changes not committed
ARG VCS_REF=
ARG VCS_DIRTY=false
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY webhook/ webhook/
COPY certs/ certs/
RUN case "$VCS_REF" in *[!0-9a-f]*) echo "VCS_REF must be a hex commit id: $VCS_REF" >&2; exit 1;; esac \
 && if [ -n "$VCS_REF" ]; then \
      printf '# the commit this image was built from (Dockerfile VCS_REF; webhook/version.py)\nCOMMIT = "%s"\nDIRTY = %s\n' \
        "$VCS_REF" "$([ "$VCS_DIRTY" = true ] && echo True || echo False)" > webhook/_commit.py; fi
# Every dependency ships manylinux wheels (cryptography included): nothing is compiled here.
# The venv's own pip builds the wheels, so the base needs no pip of its own (Debian's python3 has none).
RUN python3 -m venv /opt/dra-guard \
 && /opt/dra-guard/bin/pip wheel --constraint constraints.txt --wheel-dir /wheels . \
 && /opt/dra-guard/bin/pip install --no-index --find-links /wheels dra-guard \
 && /opt/dra-guard/bin/python -m pip uninstall --yes pip setuptools \
 && /opt/dra-guard/bin/dra-guard --help >/dev/null

FROM ${BASE}
LABEL org.opencontainers.image.title="dra-guard" \
      org.opencontainers.image.description="Admission webhook enforcing the Kubernetes good practices for Dynamic Resource Allocation" \
      org.opencontainers.image.version="0.2.0" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/dra-guard /opt/dra-guard
# The chart runs it with a read-only root filesystem: no .pyc written at run time (they were
# compiled at install), output unbuffered for the JSON log lines.
ENV PATH=/opt/dra-guard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 65532 ("nonroot" in distroless images): no passwd entry needed, matches the chart's runAsUser.
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["dra-guard"]
CMD ["serve", "--config", "/etc/dra-guard/config.yaml"]
