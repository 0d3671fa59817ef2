# The project's own image: the `outbox` command (migrations, connector apply, the polling relay,
# the lake job: Java 17 for Spark). Runs as a non-root user. The health check asks the relay's /healthz
# (one-shot commands such as `db upgrade` exit before it first runs).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY outbox ./outbox
COPY cli ./cli
COPY stack ./stack
COPY migrations ./migrations
COPY connect ./connect
COPY relay ./relay
COPY lake ./lake
COPY reconcile ./reconcile
COPY examples ./examples
# The lake job's jars (Spark's Kafka source, Delta's Spark writer, S3A for an s3:// lake root, as
# stack/outbox_stack/java pins them) are fetched once here with Maven, which is removed after: the
# job finds them in OUTBOX_STACK_DOWNLOADS and needs no network at start.
ENV OUTBOX_STACK_DOWNLOADS=/opt/outbox/downloads
RUN pip install '.[relay,lake]' \
    && apt-get update && apt-get install -y --no-install-recommends maven \
    && outbox lake packages --jars \
    && rm -rf "$OUTBOX_STACK_DOWNLOADS/m2" /root/.m2 \
    && apt-get purge -y --auto-remove maven && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home /app outbox \
    && mkdir -p /lake && chown outbox /lake
USER outbox
ENV OUTBOX_RELAY_HTTP_HOST=0.0.0.0 OUTBOX_RELAY_HTTP_PORT=8090
EXPOSE 8090
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["outbox", "relay", "health"]
ENTRYPOINT ["outbox"]
CMD ["--help"]
