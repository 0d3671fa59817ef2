# The project's own image: the `outbox` command (migrations, connector apply; later the relay
# and the lake job). Runs as a non-root user.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY outbox ./outbox
COPY cli ./cli
COPY stack ./stack
COPY migrations ./migrations
COPY connect ./connect
COPY relay ./relay
RUN pip install '.[relay]' && useradd --system --uid 10001 --home /app outbox
USER outbox
ENTRYPOINT ["outbox"]
CMD ["--help"]
