"""The on-call controller of an rlfleet run: watches pods and nodes, recovers from failures, exactly once."""
