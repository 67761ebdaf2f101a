# syntax=docker/dockerfile:1.7
# rlfleet rollout-cpu: a rollout replica, CPU build (built-in torch engine).
# Build from the repository root: docker/build.sh (or docker build -f docker/rollout-cpu.Dockerfile .)
FROM python:3.11.9-slim-bookworm

# glibc malloc keeps freed tensors' memory for reuse (rlfleet/local/malloc_env.py: MALLOC_TUNABLES)
ENV GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    HOME=/tmp \
    RLFLEET_HEALTH_PORT=50055

WORKDIR /app
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rlfleet
# Exactly what .venv holds for `dev.sh run` (locks/runtime.txt, torch 2.13.0+cpu included), every file checked
# against its hash
COPY locks/runtime.txt /tmp/runtime.txt
RUN pip install --no-cache-dir --no-deps --require-hashes --only-binary :all: \
      --extra-index-url https://download.pytorch.org/whl/cpu -r /tmp/runtime.txt
COPY docker/healthcheck.py /usr/local/bin/rlfleet-healthcheck
COPY rlfleet /app/rlfleet
COPY examples /app/examples

USER 10001:10001
EXPOSE 50055 9400
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/usr/local/bin/rlfleet-healthcheck"]
ENTRYPOINT ["python", "-m", "rlfleet.services.rollout"]
CMD ["--config", "/etc/rlfleet/config.yaml", "--listen", "0.0.0.0:50055", "--metrics-port", "9400"]
