"""The Megatron-core trainer backend (trainer.backend: megatron): backend.py (the TrainerBackend), model.py (GPTModel
from an HF config), convert.py (HF <-> Megatron names and shards), step.py, logprobs.py, grads.py, gather.py,
checkpoint.py. megatron-core is imported only when this backend is built."""
