# Worker image for docker / kubernetes work pools (see docs/deployments.md).
#   docker build -t indusflow-worker .                          # CPU torch
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 -t indusflow-worker:gpu .
# The image holds the project installed with all extras; flow runs import the flows by
# module path (flows.fraud:fraud_batch_score ...), so no code is pulled at run time.
# The home (INDUSFLOW_HOME=/data/indusflow: registry, ledgers, reports) is where work pools
# mount the shared volume (the volumes of the docker and kubernetes pools in prefect.yaml):
#   docker run -v indusflow-home:/data/indusflow indusflow-worker ...
# The folder exists in the image, owned by the run user, so a new named volume takes that owner.
#
# Second target, the REST API (python -m flows.serve; docs/serving.md):
#   docker build --target serve -t indusflow-serve .
#   docker run -p 8000:8000 -v indusflow-home:/data/indusflow indusflow-serve
# It listens on 0.0.0.0:8000 inside the container (every scoring route needs an API key or a
# JWT); keys are added with: docker run --rm -v indusflow-home:/data/indusflow indusflow-serve \
#   python -m flows.serve keys add NAME --scope fraud:score
FROM python:3.11-slim AS base

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX="https://download.pytorch.org/whl/cpu"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    INDUSFLOW_HOME=/data/indusflow \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    PREFECT_LOGGING_EXTRA_LOGGERS=infra,tasks,solutions,flows

RUN useradd --create-home --uid 1000 indusflow && mkdir -p /data/indusflow && chown -R indusflow:indusflow /data
WORKDIR /opt/indusflow

RUN pip install "${TORCH_SPEC}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml README.md constraints.txt ./
COPY flows ./flows
COPY tasks ./tasks
COPY solutions ./solutions
COPY infra ./infra
# the versions the tests passed with (make constraints)
RUN pip install -c constraints.txt ".[all]"

USER indusflow
VOLUME ["/data"]

FROM base AS serve
ENV INDUSFLOW_SERVE_HOST=0.0.0.0 \
    INDUSFLOW_SERVE_PORT=8000
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"
CMD ["python", "-m", "flows.serve"]

# The default target (last stage): the flow worker.
FROM base AS worker
# A docker/kubernetes worker starts this image per flow run with its own command;
# the default command runs a worker for a process pool, for a single-container set-up.
CMD ["prefect", "worker", "start", "--pool", "indusflow-process", "--type", "process"]
