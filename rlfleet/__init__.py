"""rlfleet SDK: what user code and every service import.

Sample (rlfleet.sample), plugin contracts (rlfleet.protocols), config (rlfleet.config),
plugin loading (rlfleet.plugins), gRPC glue (rlfleet.runtime.rpc), metrics (rlfleet.runtime.metrics), CLI (rlfleet.cli).
"""

__version__ = "0.1.0"
