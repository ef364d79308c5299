# Worker image for docker / kubernetes work pools (see README "Deployments").
#   docker build -t indusflow-worker .                          # CPU torch
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 -t indusflow-worker:gpu .
# The image holds the project installed with all extras; flow runs import the flows by
# module path (flows.fraud:fraud_batch_score ...), so no code is pulled at run time.
# The home (INDUSFLOW_HOME=/data/indusflow: registry, ledgers, reports) is where work pools
# mount the shared volume of the deployment config (home_volume in infra/deployments.yaml):
#   docker run -v indusflow-home:/data/indusflow indusflow-worker ...
# The folder exists in the image, owned by the run user, so a new named volume takes that owner.
FROM python:3.11-slim

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
COPY pyproject.toml README.md ./
COPY flows ./flows
COPY tasks ./tasks
COPY solutions ./solutions
COPY infra ./infra
RUN pip install ".[all]"

USER indusflow
VOLUME ["/data"]
# A docker/kubernetes worker starts this image per flow run with its own command;
# the default command runs a worker for a process pool, for a single-container set-up.
CMD ["prefect", "worker", "start", "--pool", "indusflow-process", "--type", "process"]
