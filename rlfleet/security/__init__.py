"""Run security: a run CA and one certificate per component (mTLS), roles per RPC, signed weights and checkpoints.

Modules: `secret_files` (0600 files created atomically), `pki` (the run CA and per-component certificates),
`identity` (what a process presents and how a peer's role is read from its certificate), `roles` (the one table
of which role may call which RPC), `authz` (the server interceptor enforcing it), `signing` (Ed25519 signatures
over weight manifests and checkpoints), `safe_unpickle` (an allow-list unpickler for torch DCP metadata).
"""
