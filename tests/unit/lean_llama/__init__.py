"""Unit tests of the torch engine's lean Llama-family path (rlfleet/services/rollout/engines/lean_llama/)."""
