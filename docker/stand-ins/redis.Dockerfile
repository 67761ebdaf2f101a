# syntax=docker/dockerfile:1.7
# Redis for the chart (its redis.image) where the chart's default, redis:7.2.5-bookworm, cannot be pulled: Debian
# bookworm's redis-server (7.0) on the same base as rlfleet's images. docker/build.sh builds it as
# $REGISTRY/rlfleet-redis:$TAG; set the chart's redis.image to it. The chart runs `redis-server` with its own
# arguments (ACL users, AOF with appendfsync always in /data) and probes with `redis-cli -p 6379 ping`; both are on
# PATH. Debian's package is not locked (a stable release's mirror keeps only its current security build), like the
# system tools of scripts/install_system_tools.sh; the chart only uses Redis 7's long-stable ACL and AOF options.
ARG BASE=debian:bookworm-20240513
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server=5:7.0.* \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
# Protected mode off by default, as in the official image (docker/stand-ins/redis-server says why); first on PATH
COPY docker/stand-ins/redis-server /usr/local/bin/redis-server
USER 10001:10001
EXPOSE 6379
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["redis-cli", "-p", "6379", "ping"]
CMD ["redis-server", "--dir", "/data"]
