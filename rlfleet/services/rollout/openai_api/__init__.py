"""The OpenAI-compatible endpoint of a rollout replica: /v1/chat/completions and /v1/completions over HTTP, each
session recorded as a TITO token sequence that becomes a training sample (see docs/architecture.md)."""
