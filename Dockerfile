# One image for every service; the command picks which one runs (Kubernetes: the container's args):
#   saga run orchestrator --with-relay      the engine, relaying its own outbox
#   saga run participant flight             a participant worker (your own: module:attribute on PYTHONPATH)
#   saga run relay                          the orchestrator's outbox relay as a service of its own
# Settings come from the environment (README, "Settings"; infra/k8s/configmap.yaml has the usual ones).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SAGA_HEALTH_HOST=0.0.0.0 \
    SAGA_HEALTH_PORT=8080 \
    SAGA_HOME=/tmp/saga

WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY schemas schemas
COPY orchestrator orchestrator
COPY outbox outbox
COPY participants participants
COPY infra infra
COPY cli cli
COPY client client
COPY testing testing
COPY console console
COPY authoring authoring
COPY operations operations
RUN pip install -c constraints.txt ".[orchestrator]" && rm -rf /src

WORKDIR /app
USER 10001
EXPOSE 8080
# /health: liveness (the process runs); /ready: readiness (in its consumer group, Kafka and Postgres answer).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/ready', timeout=2).status != 200)"]
ENTRYPOINT ["saga"]
CMD ["run", "orchestrator", "--with-relay"]
