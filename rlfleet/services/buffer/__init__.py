"""The buffer service: rollout's work queue and the trainer's durable sample store (rlfleet.v1.Buffer).

core.py decides (tickets, puts, group completion, batches, acks) over state.py's in-memory State; every change is a
mutation (mutations.py) that a store (stores/) makes durable before it is applied. grouping.py and filters.py decide
what a complete group keeps; service.py maps gRPC onto the core; server.py wires a process from the run config.
"""
