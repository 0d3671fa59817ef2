"""Example services that use the outbox SDK. Installed with the wheel: the demo runs the
order service (``python -m outbox_examples.order_service``)."""
