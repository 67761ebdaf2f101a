# syntax=docker/dockerfile:1.7
# rlfleet rollout-cuda: a rollout replica, CUDA build (SGLang engine).
# Build from the repository root: docker/build.sh (or docker build -f docker/rollout-cuda.Dockerfile .)
FROM python:3.11.9-slim-bookworm

# glibc malloc keeps freed tensors' memory for reuse (rlfleet/malloc_env.py: MALLOC_TUNABLES)
ENV GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    HOME=/tmp \
    RLFLEET_HEALTH_PORT=50055
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /app
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rlfleet
COPY docker/requirements/runtime.txt /tmp/runtime.txt
# SGLang brings its own CUDA torch build; the driver comes from the node (NVIDIA container toolkit).
RUN pip install --no-cache-dir sglang==0.5.23 nixl==1.5.1 \
 && pip install --no-cache-dir -r /tmp/runtime.txt
COPY docker/healthcheck.py /usr/local/bin/rlfleet-healthcheck
COPY rlfleet /app/rlfleet
COPY examples /app/examples

USER 10001:10001
EXPOSE 50055 9400
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/usr/local/bin/rlfleet-healthcheck"]
ENTRYPOINT ["python", "-m", "rlfleet.services.rollout"]
CMD ["--config", "/etc/rlfleet/config.yaml", "--listen", "0.0.0.0:50055", "--metrics-port", "9400"]
