# syntax=docker/dockerfile:1.7
# rlfleet trainer-cuda: a trainer rank, CUDA build (FSDP2/Megatron-core over NCCL, NIXL).
# Build from the repository root: docker/build.sh (or docker build -f docker/trainer-cuda.Dockerfile .)
FROM python:3.11.9-slim-bookworm

# glibc malloc keeps freed tensors' memory for reuse (rlfleet/local/malloc_env.py: MALLOC_TUNABLES)
ENV GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    HOME=/tmp \
    RLFLEET_HEALTH_PORT=50053
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /app
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rlfleet
# locks/image-cuda.txt: the runtime lock's versions with PyPI's CUDA torch 2.13.0, Megatron-core and NIXL, every file
# checked against its hash. CUDA runtime libraries come as nvidia-* wheels; the driver from the node.
COPY locks/image-cuda.txt /tmp/image-cuda.txt
RUN pip install --no-cache-dir --no-deps --require-hashes --only-binary :all: -r /tmp/image-cuda.txt
COPY docker/healthcheck.py /usr/local/bin/rlfleet-healthcheck
COPY rlfleet /app/rlfleet
COPY examples /app/examples

USER 10001:10001
EXPOSE 50053 9400
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/usr/local/bin/rlfleet-healthcheck"]
ENTRYPOINT ["python", "-m", "rlfleet.services.trainer"]
CMD ["--config", "/etc/rlfleet/config.yaml", "--listen", "0.0.0.0:50053", "--metrics-port", "9400"]
