"""The SGLang rollout engine: engine.py (the Engine over a SGLang HTTP server), client.py, protocol.py (request and
answer bodies), server.py (a local server subprocess), weights.py and group.py (the two weight paths), routes.py
(MoE routes for R3), factory.py (rollout.engine: sglang). SGLang itself runs in its own venv; nothing here imports
it."""
