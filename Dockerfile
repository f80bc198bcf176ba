# One image for every agentstream worker:
#   docker run IMAGE                       -> agentstream worker journal (the default)
#   docker run IMAGE worker caller         -> the LLM caller
#   docker run IMAGE topics ensure         -> create/verify the topic set
# Settings are AGENTSTREAM_* environment variables (README, "Configuration"). The Kafka broker and
# the embedded model are not included: point the caller at an OpenAI(-compatible) API.
# Needs BuildKit (the default builder since Docker 23) for RUN --mount.

# --- builder: wheels for agentstream and its pinned dependencies ------------------------------------
FROM python:3.11-slim AS builder

RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# The dependencies first (project.dependencies only: no dev tools, no llama-cpp from the `model`
# extra), so their layer stays cached while only the code changes.
COPY pyproject.toml ./
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep=chr(10))" \
        > requirements.txt \
    && pip wheel --wheel-dir /wheels -r requirements.txt
COPY schemas ./schemas
COPY processors ./processors
COPY topics ./topics
COPY pipeline ./pipeline
COPY README.md ./
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- runtime: the wheels only, no compilers ---------------------------------------------------------
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    AGENTSTREAM_DATA_DIR=/var/lib/agentstream

RUN groupadd --system --gid 10001 agentstream \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/agentstream --create-home \
       --shell /usr/sbin/nologin agentstream \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/agentstream

# The wheels are bind-mounted from the builder, so they never become a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels agentstream

# Bytecode was compiled at install time; the root filesystem may be read-only at run time.
ENV PYTHONDONTWRITEBYTECODE=1

USER 10001:10001
WORKDIR /var/lib/agentstream
# prometheus-client /metrics (AGENTSTREAM_METRICS_PORT).
EXPOSE 9464

ENTRYPOINT ["agentstream"]
CMD ["worker", "journal"]
