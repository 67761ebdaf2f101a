"""The weight_sync service: the control plane of weight versions (rlfleet/services/weight_sync/servicer.py, board.py,
__main__.py). It receives a manifest per version from the trainer, fans it out to subscribed replicas, collects
their acknowledgements and keeps the data-plane peer directory; no weight bytes pass through it.

The data planes are a separate library in transports/, imported by the trainer and the rollout replicas (see
transports/__init__.py).
"""
