"""One machine only: `rlfleet run` and `rlfleet scale` (launcher.py, scaling.py) start the services as local processes,
pin them to cores (placement.py, malloc_env.py), check the config first (preflight.py), keep warm interpreters
(warm_interpreter.py, warm_interpreters.py) and show progress and the report (report.py). A cluster never imports it:
there the chart and the controller (rlfleet/services/controller) do this work."""
