"""GPU trainer pods use every GPU: pods x GPUs per pod ranks, numbered pod by pod, each on its own device.

Checked from the rendered manifests (what Kubernetes would run) and the rank arithmetic the trainer applies to the
environment those manifests give each pod."""

from __future__ import annotations

import pytest
import yaml

from rlfleet.services.trainer.ranks import RankLayoutError, pod_from_env, pod_ranks
from tests.cluster.chart import by_kind, pod_spec, render, scenario_values


def _trainer_workload(objects: list[dict]) -> dict:
    for kind in ("StatefulSet", "JobSet"):
        for o in by_kind(objects, kind):
            if o["metadata"]["labels"].get("app.kubernetes.io/component") == "trainer":
                return o
    raise AssertionError("no trainer workload rendered")


def _pods(workload: dict) -> int:
    if workload["kind"] == "StatefulSet":
        return int(workload["spec"]["replicas"])
    job = workload["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == job["completions"]
    return int(job["parallelism"])


def _gang(objects: list[dict]) -> tuple[int, int, int, int, int]:
    """(pods, ranks per pod, WORLD_SIZE env, GPUs per pod, run config world_size) as rendered."""
    workload = _trainer_workload(objects)
    container = pod_spec(workload)["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    gpus = int(container["resources"]["limits"].get("nvidia.com/gpu", 0))
    cm = next(o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-config"))
    world_cfg = yaml.safe_load(cm["data"]["config.yaml"])["trainer"]["world_size"]
    return _pods(workload), int(env["RLFLEET_RANKS_PER_POD"]), int(env["WORLD_SIZE"]), gpus, int(world_cfg)


@pytest.mark.parametrize("values", [scenario_values("gpu-64gpus-2racks"),
                                    {**scenario_values("gpu-64gpus-2racks"), "jobSet": {"enabled": True}}],
                         ids=["statefulset", "jobset"])
def test_the_64_gpu_values_train_on_32_gpus(values: dict) -> None:
    pods, per_pod, world_env, gpus, world_cfg = _gang(render(values))
    assert (pods, per_pod, gpus) == (4, 8, 8)
    assert world_env == world_cfg == pods * gpus == 32
    # What each pod's supervisor starts, from the environment the chart gives pod i.
    placements = [p for i in range(pods)
                  for p in pod_from_env({"RLFLEET_POD_INDEX": str(i), "RLFLEET_RANKS_PER_POD": str(per_pod),
                                         "WORLD_SIZE": str(world_env)}) or []]
    assert sorted(p.rank for p in placements) == list(range(32)), "every rank exactly once"
    for i in range(pods):
        mine = [p for p in placements if p.pod_index == i]
        assert [p.local_rank for p in mine] == list(range(gpus)), "one rank per GPU of the pod"
        assert [p.rank for p in mine] == list(range(i * gpus, (i + 1) * gpus)), "a pod's ranks are contiguous"
    rank0 = next(p for p in placements if p.rank == 0)
    assert (rank0.pod_index, rank0.local_rank) == (0, 0), "rank 0 (rendezvous, gRPC) is pod 0's first rank"


def test_cpu_pods_run_one_rank_each_and_ranks_per_pod_is_settable() -> None:
    pods, per_pod, world, gpus, world_cfg = _gang(render({"trainer": {"pods": 3}}))
    assert (pods, per_pod, world, gpus, world_cfg) == (3, 1, 3, 0, 3)
    pods, per_pod, world, _, world_cfg = _gang(render({"trainer": {"pods": 2, "gpusPerPod": 8, "ranksPerPod": 4},
                                                       "image": {"variant": "cuda"}}))
    assert (pods, per_pod, world, world_cfg) == (2, 4, 8, 8)


def test_more_ranks_than_gpus_in_a_pod_is_refused_at_render() -> None:
    with pytest.raises(Exception, match="ranksPerPod=9 is more than trainer.gpusPerPod=8"):
        render({"trainer": {"gpusPerPod": 8, "ranksPerPod": 9}, "image": {"variant": "cuda"}})


def test_rank_arithmetic_refuses_a_layout_that_cannot_be() -> None:
    assert pod_from_env({"RANK": "3", "RLFLEET_RANKS_PER_POD": "8", "WORLD_SIZE": "64"}) is None, "already a rank"
    assert pod_from_env({}) is None, "a local run: the launcher sets RANK itself"
    with pytest.raises(RankLayoutError, match="not a multiple"):
        pod_from_env({"RLFLEET_POD_INDEX": "0", "RLFLEET_RANKS_PER_POD": "8", "WORLD_SIZE": "60"})
    with pytest.raises(RankLayoutError, match="outside 0..7"):
        pod_ranks(8, pods=8, ranks_per_pod=8)
    with pytest.raises(RankLayoutError, match="not an integer"):
        pod_from_env({"RLFLEET_POD_INDEX": "trainer-0", "RLFLEET_RANKS_PER_POD": "8", "WORLD_SIZE": "64"})


def test_gpu_rollout_pods_run_sglang_tensor_parallel_over_their_gpus() -> None:
    from rlfleet.config import parse_config

    objects = render(scenario_values("gpu-64gpus-2racks"))
    cm = next(o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-config"))
    cfg = parse_config(yaml.safe_load(cm["data"]["config.yaml"]), "rendered")
    rollout = next(o for o in by_kind(objects, "Deployment")
                   if o["metadata"]["labels"].get("app.kubernetes.io/component") == "rollout")
    gpus = int(pod_spec(rollout)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    assert cfg.rollout.engine == "sglang" and cfg.rollout.sglang.tp == gpus == 4
    assert cfg.rollout.sglang.python == "/opt/sglang/bin/python", "the CUDA image keeps SGLang in its own venv"
    assert cfg.rollout.sglang.mem_fraction_static == 0.85
    mine = render({**scenario_values("gpu-64gpus-2racks"),
                   "runConfig": {**scenario_values("gpu-64gpus-2racks")["runConfig"],
                                 "rollout": {**scenario_values("gpu-64gpus-2racks")["runConfig"]["rollout"],
                                             "sglang": {"tp": 2, "max_total_tokens": 262144}}}})
    cm = next(o for o in by_kind(mine, "ConfigMap") if o["metadata"]["name"].endswith("-config"))
    sg = parse_config(yaml.safe_load(cm["data"]["config.yaml"]), "rendered").rollout.sglang
    assert (sg.tp, sg.max_total_tokens) == (2, 262144), "the run config's own settings win"
