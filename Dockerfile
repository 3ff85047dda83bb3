# dra-guard's container image: `dra-guard serve` on a slim Python base, as a non-root user.
#
#   docker build -t <registry>/dra-guard:0.2.0 .
#
# Stage 1 builds the wheels (dra-guard and every dependency) and installs them into a virtualenv;
# stage 2 copies only that virtualenv onto a fresh slim base: no compiler, no pip, no sources.
# The base is pinned by version (bump both FROM lines together; add @sha256:... to pin the digest).

FROM python:3.11.13-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY webhook/ webhook/
COPY certs/ certs/
# Every dependency ships manylinux wheels (cryptography included): nothing is compiled here.
RUN python -m pip wheel --wheel-dir /wheels . \
 && python -m venv /opt/dra-guard \
 && /opt/dra-guard/bin/pip install --no-index --find-links /wheels dra-guard \
 && /opt/dra-guard/bin/python -m pip uninstall --yes pip setuptools \
 && /opt/dra-guard/bin/dra-guard --help >/dev/null

FROM python:3.11.13-slim-bookworm
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
