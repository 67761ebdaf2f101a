"""What a model's weights are and where they come from: dtype names shared by configs, manifests and checkpoints
(dtypes.py), tied weights (tied.py), what `model.path` may name, GGUF converted once (model_source.py), and the
models that ship inside Python packages (model_packages.py)."""
