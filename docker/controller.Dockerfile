# syntax=docker/dockerfile:1.7
# rlfleet controller: the on-call controller of a run (official Kubernetes client; no torch).
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
# locks/controller.txt: the Kubernetes client and the SDK's config, gRPC, security and metrics (no torch), every file
# checked against its hash, from the wheelhouse alone
COPY locks/controller.txt /tmp/controller.txt
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    python3 -m venv /opt/rlfleet \
 && /opt/rlfleet/bin/pip install --no-cache-dir --no-index --find-links /wheels --no-deps --require-hashes \
      --only-binary :all: -r /tmp/controller.txt \
 && rm /tmp/controller.txt
ENV RLFLEET_METRICS_PORT=9400
COPY rlfleet /app/rlfleet

USER 10001:10001
EXPOSE 9400
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['RLFLEET_METRICS_PORT'] + '/metrics', timeout=4)"]
ENTRYPOINT ["python", "-m", "rlfleet.services.controller"]
