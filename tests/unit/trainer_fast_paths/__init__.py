"""Tests of the FSDP trainer's fast paths (rlfleet/services/trainer/fast_paths/): each module swap, the shared-prompt
forward, and the table that says which swaps a configuration takes."""
