"""Generated gRPC stubs for rlfleet.v1 (scripts/gen_protos.py). Do not edit."""
