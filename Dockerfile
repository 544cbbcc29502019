# syntax=docker/dockerfile:1
# One image for every streamworks process: `docker run IMAGE coordinator`,
# `docker run IMAGE worker examples.orders.app:app`, `docker run IMAGE status`.
# Your own app: `FROM` this image, `COPY` your package into /app, run `worker pkg.mod:app`.

# -- build: a virtualenv with streamworks and its dependencies --------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/streamworks
WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/constraints.txt ./constraints.txt
COPY streamworks ./streamworks
# Exactly the versions of deploy/constraints.txt (built with pip from the package's
# runtime dependencies: no extras, nothing a laptop or a test needs).
RUN /opt/streamworks/bin/pip install --constraint constraints.txt .

# -- runtime: the virtualenv, the examples, an unprivileged user ------------------------
FROM python:3.11-slim AS runtime
RUN groupadd --system --gid 10001 streamworks \
 && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
      --shell /usr/sbin/nologin streamworks
COPY --from=build /opt/streamworks /opt/streamworks
WORKDIR /app
COPY --chown=10001:10001 examples ./examples
# Coordinators and workers listen on every interface inside the container (the
# default, 127.0.0.1, is for a laptop).
ENV PATH=/opt/streamworks/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    STREAMWORKS_COORDINATOR__HOST=0.0.0.0 \
    STREAMWORKS_WORKER__HTTP_HOST=0.0.0.0
USER 10001:10001
# 7400: the coordinator's API, /readyz, /livez, /metrics and /ui.
# 9400: a worker's /livez, /readyz and /metrics.
EXPOSE 7400 9400
ENTRYPOINT ["streamworks"]
CMD ["coordinator"]
