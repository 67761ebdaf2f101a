# syntax=docker/dockerfile:1.7
# rlfleet trainer-cuda: a trainer rank, CUDA build (FSDP2/Megatron-core over NCCL, NIXL).
# Build from the repository root with docker/build.sh (podman or docker): it makes the wheelhouse image (WHEELS) from
# the lock and passes the base (BASE). See docker/README.md.
ARG BASE=python:3.11.9-slim-bookworm
ARG WHEELS=localhost/rlfleet-wheelhouse:made-by-docker-build-sh
FROM ${WHEELS} AS wheels

FROM ${BASE}
# The layers up to the rlfleet install are the same instructions in the same order in trainer-cuda and rollout-cuda:
# the engine builds them once and both images share them. Role-specific settings come after.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    HOME=/tmp \
    PATH=/opt/rlfleet/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /app
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rlfleet
# locks/image-cuda.txt: the runtime lock's versions with PyPI's CUDA torch 2.13.0, Megatron-core and NIXL, every file
# checked against its hash, from the wheelhouse alone. CUDA runtime libraries come as nvidia-* wheels; the driver from
# the node. TORCH=cpu (docker/build.sh --cuda-torch cpu, for machines without the CUDA wheels or a GPU) installs the
# same lock with the runtime lock's CPU torch instead of the CUDA torch and its nvidia-*/cuda-*/triton wheels
# (docker/cpu_torch_lock.py): the recipe and the Python imports are checked, CUDA is not.
ARG TORCH=cuda
COPY locks/image-cuda.txt locks/runtime.txt docker/cpu_torch_lock.py /tmp/
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    python3 -m venv /opt/rlfleet \
 && if [ "$TORCH" = cpu ]; then python3 /tmp/cpu_torch_lock.py /tmp/image-cuda.txt /tmp/runtime.txt --in-place; fi \
 && /opt/rlfleet/bin/pip install --no-cache-dir --no-index --find-links /wheels --no-deps --require-hashes \
      --only-binary :all: -r /tmp/image-cuda.txt \
 && rm /tmp/image-cuda.txt /tmp/runtime.txt /tmp/cpu_torch_lock.py
# glibc malloc keeps freed tensors' memory for reuse (rlfleet/local/malloc_env.py: MALLOC_TUNABLES)
ENV GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
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
