"""The four services of a run, each a process (`python -m rlfleet.services.<name>`): rollout/ (inference replicas),
buffer/ (the durable work queue and sample store), trainer/ (FSDP2 or Megatron-core ranks), weight_sync/ (the control
plane of weight versions; its transports/ library is the one piece the trainer and rollout import), and controller/,
the cluster's on-call recovery. Services talk to each other only over gRPC (proto/, rlfleet/v1/)."""
