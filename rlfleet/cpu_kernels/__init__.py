"""CPU-only kernels: oneDNN linears (onednn_linear.py), a fused RMSNorm (rms_norm.py) and the batch-invariant ops of the
true on-policy mode (batch_invariant.py). A GPU user can ignore this folder: nothing here runs on CUDA. The services
reach it only through their fast-path doors (services/trainer/fast_paths, services/rollout/engines/lean_llama)."""
