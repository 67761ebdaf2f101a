"""The rollout service: one inference engine replica (engines/: the built-in torch engine, SGLang) that claims prompt
tickets from the buffer, runs the rollout function (rollout_fns.py; single_turn_groups.py is single_turn's collector),
scores, and streams each finished sample to the buffer (work_loop.py). It pauses for and loads new weights
(weight_updates.py, partial.py), serves an OpenAI-compatible endpoint (openai_api/) and records TITO sessions
(tito.py). server.py wires a process from the run config; servicer.py maps gRPC onto it."""
