"""The trainer service: ranks that pull batches from the buffer, compute advantages and the loss with off-policy
correction, step the optimizer, checkpoint, and publish weights.

- the step: batch.py (samples to padded tensors), step.py and step_totals.py (the FSDP step; backends/megatron/step.py
  is Megatron's), advantages.py, losses.py, entropy.py, algorithms.py and check_algorithm.py (what a config's
  algorithm means), critic.py, aux_models.py (reference and teacher), routing_replay.py (R3), lora.py, optimizer.py,
  schedule.py, sequence_packing.py, logits_window.py, token_versions.py, batch_stats.py, batch_check.py;
- backends/: the TrainerBackend contract and its FSDP2 and Megatron-core implementations;
- fast_paths/: optional speed (model swaps and the training forward's wrapper) behind one door; a GPU user reads
  only its `__init__`;
- checkpoints and exports: checkpoint.py, checkpoint_seal.py, export.py, hf_export.py;
- the process: server.py, service.py, servicer.py, clients.py, publisher.py, evaluation.py, dashboards.py, ranks.py,
  local_ranks.py, collectives.py, distributed_exit.py.
"""
