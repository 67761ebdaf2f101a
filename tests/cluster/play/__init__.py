"""The rendered chart played on podman (issue 39 items 2-3): no Kubernetes API server runs here, so a small adapter
maps the objects `helm template` renders to podman networks, volumes and containers, and a scenario runner does to
the played run what users do to theirs (scale, kill -9, restart a pod, cut a host off).

plan.py      rendered objects -> a Plan (pure: pods, their aliases, mounts, env, security; the not-enforced list)
files.py     the ConfigMap / Secret volumes a Plan names, written as the kubelet would project them
podman.py    a Plan played, and a new Plan applied as a diff (the podman commands)
secrets.py   `security.existingSecrets` made the way `kubectl create secret` holds them, issued by rlfleet's run CA
scenario.py  a played run of the addition example with operations, the fault ledger and recovery times
It lives under tests/ because it is a rig for the chart (it renders with tests/cluster/chart.py and judges with
tests/faults/ledger.py), not something users run: they run `helm install` on a cluster.
"""
