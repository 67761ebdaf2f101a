# syntax=docker/dockerfile:1.7
# rlfleet rollout-cuda: a rollout replica, CUDA build (SGLang engine).
# Build from the repository root: docker/build.sh (or docker build -f docker/rollout-cuda.Dockerfile .)
FROM python:3.11.9-slim-bookworm

# glibc malloc keeps freed tensors' memory for reuse (rlfleet/local/malloc_env.py: MALLOC_TUNABLES)
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
# rlfleet's environment (locks/image-cuda.txt: PyPI's CUDA torch, NIXL) and SGLang's own venv at /opt/sglang
# (locks/sglang-cuda.txt: SGLang pins its own torch and transformers), each file checked against its hash. The
# replica starts /opt/sglang/bin/python -m sglang.launch_server (the chart's rollout.sglang.python).
COPY locks/image-cuda.txt locks/sglang-cuda.txt /tmp/
RUN pip install --no-cache-dir --no-deps --require-hashes --only-binary :all: -r /tmp/image-cuda.txt \
 && python -m venv /opt/sglang \
 && /opt/sglang/bin/pip install --no-cache-dir --no-deps --require-hashes --only-binary :all: -r /tmp/sglang-cuda.txt
COPY docker/healthcheck.py /usr/local/bin/rlfleet-healthcheck
COPY rlfleet /app/rlfleet
COPY examples /app/examples

USER 10001:10001
EXPOSE 50055 9400
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "/usr/local/bin/rlfleet-healthcheck"]
ENTRYPOINT ["python", "-m", "rlfleet.services.rollout"]
CMD ["--config", "/etc/rlfleet/config.yaml", "--listen", "0.0.0.0:50055", "--metrics-port", "9400"]
