"""The ``outbox`` console command. It stands on every other package; nothing imports it."""
