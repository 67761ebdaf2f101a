"""What a model's weights are and where they come from: dtype names shared by configs, manifests and checkpoints
(dtypes.py), tied weights (tied.py), and what `model.path` may name, GGUF converted once (model_source.py)."""
