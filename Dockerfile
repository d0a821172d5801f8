# The gpuq image: `gpuq serve` by default; the Helm chart (deploy/helm/gpuq) runs every part from it
# (serve, collect, dashboard). Not built here (no docker where gpuq is developed): kept minimal, and
# tests/test_helm.py checks what can be checked without building it.
#
#   docker build -t REGISTRY/gpuq:0.1.0 .                    # with the dashboards and NVML (default)
#   docker build --build-arg EXTRAS=nvml -t REGISTRY/gpuq:0.1.0-nodash .
#
# Runs as the numeric non-root user 10001 on a read-only root filesystem: everything it writes goes
# to volumes the chart mounts (the chDB store and spill directory under /var/lib/gpuq, and /tmp).
FROM python:3.11.13-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuq gpuq
COPY collector collector
COPY accounting accounting
COPY scheduler scheduler
COPY dashboards dashboards
ARG EXTRAS=dashboards,nvml
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[${EXTRAS}]"

FROM python:3.11.13-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/*.whl \
 && rm -rf /wheels \
 && groupadd --system --gid 10001 gpuq \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin gpuq \
 && mkdir -p /var/lib/gpuq /etc/gpuq \
 && chown 10001:10001 /var/lib/gpuq
USER 10001:10001
WORKDIR /var/lib/gpuq
EXPOSE 8377 8501 9464
ENTRYPOINT ["gpuq"]
CMD ["serve", "--config", "/etc/gpuq/gpuq.yaml"]
