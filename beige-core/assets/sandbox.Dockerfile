# The default sandbox image of beige: `beige-sandbox:latest`.
#
# A Debian slim userland with common tools and Python. Nothing beige-specific is baked in:
# the gateway bind-mounts the static shim at /beige/shim, starts it as the entrypoint
# (`/beige/shim init`), and mounts the workspace, launchers, tool docs and skills.
#
# Build (needs a registry for the base image and Debian's mirror for the packages):
#   docker build -t beige-sandbox:latest -f beige-core/assets/sandbox.Dockerfile beige-core/assets/
# On an engine started with --bridge=none, build containers have no network; give the build
# the host's network for apt:
#   docker build --network=host -t beige-sandbox:latest -f beige-core/assets/sandbox.Dockerfile beige-core/assets/
# Offline, from the local Debian base made by `scripts/setup-docker --debian-base`
# (it already holds the tools, so no package is downloaded):
#   docker build --build-arg BASE=beige-test-debian:bookworm -t beige-sandbox:latest -f beige-core/assets/sandbox.Dockerfile beige-core/assets/
ARG BASE=debian:bookworm-slim
FROM ${BASE}

LABEL org.opencontainers.image.title="beige-sandbox" \
      org.opencontainers.image.description="Default beige agent sandbox: Debian with common tools and Python" \
      org.opencontainers.image.source="https://github.com/beige-rs/beige" \
      org.opencontainers.image.url="https://github.com/beige-rs/beige" \
      org.opencontainers.image.documentation="https://github.com/beige-rs/beige/blob/main/beige-core/assets/README.md" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.vendor="beige contributors" \
      io.beige.image="default"

# Build-time only: not part of the image's environment.
ARG DEBIAN_FRONTEND=noninteractive

# Common tools, installed only when the base lacks them: a pre-populated base builds with no
# network at all.
RUN set -eu; \
    if command -v python3 >/dev/null 2>&1 && command -v jq >/dev/null 2>&1 \
       && command -v curl >/dev/null 2>&1 && command -v git >/dev/null 2>&1; then \
        echo "beige-sandbox: python3, jq, curl and git are in the base image; no packages installed"; \
    else \
        apt-get update; \
        apt-get install -y --no-install-recommends \
            ca-certificates curl jq git python3 python3-pip procps less file unzip xz-utils; \
        apt-get clean; \
        rm -rf /var/lib/apt/lists/*; \
    fi

# The mount points the gateway uses, and the unprivileged user it runs agents as when it
# runs as root itself (uid/gid 1000).
RUN set -eu; \
    mkdir -p /workspace /tools/bin /tools/packages /skills /beige; \
    if ! getent group 1000 >/dev/null; then groupadd --gid 1000 sandbox; fi; \
    if ! getent passwd 1000 >/dev/null; then \
        useradd --uid 1000 --gid 1000 --create-home --home-dir /home/sandbox \
            --shell /bin/bash sandbox; \
    fi; \
    mkdir -p /home/sandbox; \
    chown 1000:1000 /workspace /home/sandbox

ENV PATH=/tools/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /workspace
