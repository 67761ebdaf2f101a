"""The chart renders for every values scenario, each core object passes kubernetes-validate --strict, and the
schema refuses misspelt values."""

from __future__ import annotations

import pytest

from tests.cluster.chart import CHART, SCENARIOS, VALUES, merge, render, scenario_values
from tests.cluster.tools import need_module

# Kinds that come from CRDs (no upstream schema to validate against; cert-manager's are checked against its
# documented fields in test_chart_mtls.py); everything else must validate. The optional ones are opt-in; cert-manager's
# come with the default security.mode mtls.
OPTIONAL_CRD_KINDS = {"JobSet", "LeaderWorkerSet", "ServiceMonitor", "PrometheusRule", "ScaledObject"}
CRD_KINDS = OPTIONAL_CRD_KINDS | {"Certificate", "Issuer"}
KUBE_VERSIONS = ["1.28.0", "1.37.0"]


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    need_module("helm_python")
    need_module("kubernetes_validate")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(scenario_values(name)) for name in SCENARIOS}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_core_object_validates_strictly(rendered: dict[str, list[dict]], scenario: str) -> None:
    import kubernetes_validate as kv

    objects = rendered[scenario]
    assert len(objects) > 20
    checked = 0
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        for version in KUBE_VERSIONS:
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(f"{scenario}: {obj['kind']}/{obj['metadata']['name']} invalid for {version}: {exc}")
        checked += 1
    assert checked >= 20
    print(f"{scenario}: {checked} core objects valid (strict) for Kubernetes {', '.join(KUBE_VERSIONS)}")


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_scenario_passes_the_values_check_on_the_config_it_renders(rendered: dict[str, list[dict]],
                                                                         scenario: str) -> None:
    """rlfleet chart-check passes every shipped stack, and what it reads as the run config is what the chart
    renders into the ConfigMap (its GPU defaults for SGLang are repeated in rlfleet/chart/values.py)."""
    import yaml

    from rlfleet.chart.checks import CHECKS, run_checks, stack_of
    from rlfleet.chart.values import load_values
    from rlfleet.config import parse_config

    files = [VALUES / f for f in SCENARIOS[scenario]]
    findings = run_checks(files)
    assert {f.check for f in findings} == set(CHECKS)
    assert all(f.ok for f in findings), [f.message for f in findings if not f.ok]
    cm = next(o for o in rendered[scenario] if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config"))
    cfg = parse_config(yaml.safe_load(cm["data"]["config.yaml"]), "rendered")
    run = stack_of(load_values(files)).run
    assert run.rollout.sglang == cfg.rollout.sglang
    assert (run.rollout.engine, run.rollout.max_batch_size, run.rollout.sampling) == \
        (cfg.rollout.engine, cfg.rollout.max_batch_size, cfg.rollout.sampling)
    assert (run.trainer.world_size, run.trainer.backend) == (cfg.trainer.world_size, cfg.trainer.backend)
    assert (run.gpu_rollout, run.gpu_trainer) == (cfg.rollout.device == "cuda", cfg.trainer.device == "cuda")


def test_optional_integrations_render_their_crd_objects(rendered: dict[str, list[dict]]) -> None:
    kinds = {o["kind"] for o in rendered["gpu-integrations"]}
    assert OPTIONAL_CRD_KINDS - {"ScaledObject"} <= kinds, "(KEDA replaces the HPA: test_keda_scaled_object)"
    assert "HorizontalPodAutoscaler" in kinds
    plain = {o["kind"] for o in rendered["gpu-64gpus-2racks"]}
    assert not (OPTIONAL_CRD_KINDS & plain), "CRD objects must be opt-in"


def test_chart_lints_clean() -> None:
    import helm_python as helm

    for name in SCENARIOS:
        report = helm.lint(str(CHART), scenario_values(name), strict=True)
        errors = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
        assert not errors, f"{name}: {errors}"


@pytest.mark.parametrize("values, where", [
    ({"trainer": {"rnaks": 8}}, "rnaks"),
    ({"sapres": {"count": 2}}, "sapres"),
    ({"topology": {"rackLable": "x"}}, "rackLable"),
    ({"rollout": {"hpa": {"enabeld": True}}}, "enabeld"),
    ({"image": {"variant": "rocm"}}, "variant"),
    ({"metrics": {"port": 9500}}, "port"),
    ({"runConfig": {"trainer": {"stepz": 3}}}, "stepz"),                      # run-config sections: the model's
    ({"runConfig": {"rollout": {"sampling": {"top_pp": 0.9}}}}, "top_pp"),    # schema (scripts/gen_config_docs.py)
    ({"runConfig": {"buffer": {"capacity": 0}}}, "capacity"),
    ({"runConfig": {"weight_sync": {"transport": "carrier"}}}, "transport"),
    ({"runConfig": {"trainer": {"dapo_clip_high": 0.3}}}, "dapo_clip_high"),
])
def test_schema_refuses_misspelt_or_wrong_values(values: dict, where: str) -> None:
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError) as info:
        render(values)
    assert where in str(info.value)


def test_defaults_render_and_validate() -> None:
    import kubernetes_validate as kv

    for obj in render():
        if obj["kind"] not in CRD_KINDS:
            kv.validate(obj, "1.37.0", strict=True)


def test_keda_scaled_object_owns_the_rollout_count_on_the_buffer_room() -> None:
    values = merge(scenario_values("gpu-64gpus-2racks"),
                   {"rollout": {"keda": {"enabled": True, "minReplicas": 2, "maxReplicas": 12}}})
    objects = render(values)
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    assert len(scaled) == 1 and not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    spec = scaled[0]["spec"]
    rollout = next(o for o in objects if o["kind"] == "Deployment"
                   and o["metadata"]["labels"]["app.kubernetes.io/component"] == "rollout")
    assert spec["scaleTargetRef"]["name"] == rollout["metadata"]["name"]
    assert "replicas" not in rollout["spec"], "KEDA owns the replica count"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 12)
    trigger = spec["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"]["query"] == \
        'max(rlfleet:buffer_free_samples{namespace="team-a",service="run1-buffer"})'
    with pytest.raises(Exception, match="enable one"):
        render(merge(values, {"rollout": {"hpa": {"enabled": True}}}))


def _run_config_replicas(objects: list[dict]) -> int:
    import yaml

    cm = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config"))
    return int(yaml.safe_load(cm["data"]["config.yaml"])["rollout"]["replicas"])


@pytest.mark.parametrize("rollout,expected", [
    ({"replicas": 4}, 4),
    ({"replicas": 4, "hpa": {"enabled": True, "minReplicas": 2, "maxReplicas": 8}}, 2),
    ({"replicas": 4, "keda": {"enabled": True, "minReplicas": 3, "maxReplicas": 8}}, 3),
], ids=["fixed", "hpa", "keda"])
def test_the_run_config_names_the_replicas_the_run_starts_with(rollout: dict, expected: int) -> None:
    """The first broadcast group and NIXL publish wait for this many replicas: the Deployment's count, or the
    autoscaler's minimum (later publishes take whoever is there)."""
    objects = render({"rollout": rollout})
    assert _run_config_replicas(objects) == expected
    deployment = next(o for o in objects if o["kind"] == "Deployment"
                      and o["metadata"]["labels"]["app.kubernetes.io/component"] == "rollout")
    if "replicas" in deployment["spec"]:
        assert deployment["spec"]["replicas"] == expected
