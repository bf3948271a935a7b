# One image for every recmesh service; the command picks the service:
#   python -m services.feature | services.feature.ingest | services.inference
#   | services.ranker | services.gateway
# Dependencies come from requirements.lock; the default model is trained at
# build time and baked in, so a starting container downloads nothing.

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY requirements-runtime.lock ./
RUN /opt/venv/bin/pip install --require-hashes -r requirements-runtime.lock
COPY pyproject.toml README.md ./
COPY recmesh ./recmesh
COPY services ./services
RUN /opt/venv/bin/pip install --no-deps . \
 && /opt/venv/bin/recmesh train --model-dir /opt/recmesh/models --json

FROM python:3.11.11-slim-bookworm AS runtime
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin recmesh
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=recmesh:recmesh /opt/recmesh/models /opt/recmesh/models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    BIND_HOST=0.0.0.0 \
    RECMESH_MODEL_DIR=/opt/recmesh/models
USER 10001
EXPOSE 8000 50051 50052 50053 50054 9102 9103 9104 9105
CMD ["python", "-m", "services.gateway"]
