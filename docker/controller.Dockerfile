# syntax=docker/dockerfile:1.7
# rlfleet controller: the on-call controller of a run (official Kubernetes client; no torch).
# Build from the repository root: docker/build.sh (or docker build -f docker/controller.Dockerfile .)
FROM python:3.11.9-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    HOME=/tmp \
    RLFLEET_METRICS_PORT=9400

WORKDIR /app
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rlfleet
# locks/controller.txt: the Kubernetes client and the SDK's config, gRPC, security and metrics (no torch), every file
# checked against its hash
COPY locks/controller.txt /tmp/controller.txt
RUN pip install --no-cache-dir --no-deps --require-hashes --only-binary :all: -r /tmp/controller.txt
COPY rlfleet /app/rlfleet

USER 10001:10001
EXPOSE 9400
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['RLFLEET_METRICS_PORT'] + '/metrics', timeout=4)"]
ENTRYPOINT ["python", "-m", "rlfleet.services.controller"]
