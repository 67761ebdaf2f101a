"""`rlfleet chart-check VALUES...`: does a stack of Helm values files make sense on the GPUs it names, before
`helm install`?

values.py merges the files over the chart's defaults (as `helm install -f A -f B` does) and reads the run config
the chart would render; sizing.py holds what the check knows about the cluster and the model (the values'
`sizing` section) and the arithmetic on it (bf16 bytes, SGLang's KV pool, read-back time); placement.py puts the
run's GPU pods on racks and nodes; checks.py is the checks, one function each, run in order by run_checks.
docs/cluster.md "Checking values before install" states every rule.
"""
