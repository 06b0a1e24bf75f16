# The Bubblescope service image: `bubblescope serve`, `bubblescope db upgrade`, `bubblescope token create`.
#
#   docker build -t bubblescope .        (docker compose build does the same for docker-compose.yml)
#
# The package is installed here, once, at build time, from a copy of the tree in a build directory of
# the image's own: nothing is installed when a container starts, and no source is mounted into one (a
# read-only mount cannot take the build's bubblescope.egg-info). Only the server extra is installed:
# the service does not need torch (that is the training job's, and the demo's).
#
# tests/deploy/test_image.py performs these steps natively, from a read-only copy of the tree filtered by
# .dockerignore, and runs the installed command.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /build
COPY . .
# The collector's optional C hot path needs a compiler, which this image has not: the build skips it,
# and the service never uses it.
RUN pip install '.[server]' && rm -rf /build

# Not root. Its home holds the default SQLite database of a bare `docker run ... serve`.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/bubblescope bubblescope
USER bubblescope
WORKDIR /home/bubblescope

EXPOSE 8765
# The health check is docker-compose.yml's (it knows the port the service listens on).
ENTRYPOINT ["bubblescope"]
CMD ["--help"]
