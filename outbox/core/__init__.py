"""The pure core: envelope, encoding, names, SQL text and decisions. Standard library only
(plus the UUIDv7 generator); never imports SQLAlchemy, psycopg, Kafka or Spark."""
