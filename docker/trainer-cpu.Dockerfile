# syntax=docker/dockerfile:1.7
# rlfleet trainer-cpu: a trainer rank, CPU build (FSDP2 over gloo).
# Build from the repository root with docker/build.sh (podman or docker): it makes the wheelhouse image (WHEELS) from
# the lock and passes the base (BASE). See docker/README.md.
ARG BASE=python:3.11.9-slim-bookworm
ARG WHEELS=localhost/rlfleet-wheelhouse:made-by-docker-build-sh
FROM ${WHEELS} AS wheels

FROM ${BASE}
# The layers up to the install are the same instructions in the same order in buffer, weight-sync, trainer-cpu and
# rollout-cpu: the engine builds them once and the four images share them. Role-specific settings come after.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    HOME=/tmp \
    PATH=/opt/rlfleet/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /app
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rlfleet
# Exactly what .venv holds for `dev.sh run` (locks/runtime.txt, torch 2.13.0+cpu included), every file checked
# against its hash, installed from the wheelhouse alone (--no-index): nothing is resolved or fetched at build time.
# A venv (/opt/rlfleet, first on PATH) works alike on the python slim image and on Debian's python3.
COPY locks/runtime.txt /tmp/runtime.txt
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    python3 -m venv /opt/rlfleet \
 && /opt/rlfleet/bin/pip install --no-cache-dir --no-index --find-links /wheels --no-deps --require-hashes \
      --only-binary :all: -r /tmp/runtime.txt \
 && rm /tmp/runtime.txt
# glibc malloc keeps freed tensors' memory for reuse (rlfleet/local/malloc_env.py: MALLOC_TUNABLES)
ENV GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184
ENV RLFLEET_HEALTH_PORT=50053
COPY docker/healthcheck.py /usr/local/bin/rlfleet-healthcheck
COPY rlfleet /app/rlfleet
COPY examples /app/examples

USER 10001:10001
EXPOSE 50053 9400
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/usr/local/bin/rlfleet-healthcheck"]
ENTRYPOINT ["python", "-m", "rlfleet.services.trainer"]
CMD ["--config", "/etc/rlfleet/config.yaml", "--listen", "0.0.0.0:50053", "--metrics-port", "9400"]
