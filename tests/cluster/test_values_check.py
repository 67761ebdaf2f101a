"""rlfleet chart-check: each check refuses a crafted bad stack with the numbers worked out by hand here (not by the
code under test). That every shipped stack passes: tests/cluster/test_chart_render.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlfleet.chart.checks import CHECKS, Finding, stack_of
from rlfleet.chart.values import load_values, merge
from rlfleet.cli import main
from tests.cluster.chart import SCENARIOS, VALUES

GPU = VALUES / "gpu-64gpus-2racks.yaml"
GiB = 2 ** 30
QWEN7_BF16 = 7.62e9 * 2                       # sizing.model.paramsB 7.62, 2 bytes each
QWEN7_KV_PER_TOKEN_TP4 = 1 * 2 * 128 * 28 * 2  # 4 KV heads // tp 4 = 1 head, K and V, head_dim, layers, bf16


def _findings(over: dict[str, Any], check: str, base: Path = GPU) -> list[Finding]:
    return CHECKS[check](stack_of(merge(load_values([base]), over)))


def _failed(over: dict[str, Any], check: str) -> str:
    bad = [f.message for f in _findings(over, check) if not f.ok]
    assert bad, f"{check} passed {over}"
    return " | ".join(bad)


def test_every_values_file_is_in_a_checked_stack() -> None:
    used = {f for files in SCENARIOS.values() for f in files}
    assert {p.name for p in VALUES.glob("*.yaml")} <= used, "add the file's stack to tests/cluster/chart.py SCENARIOS"


def test_the_64_gpu_stack_splits_32_and_32_over_its_racks() -> None:
    (gpus,) = _findings({}, "gpus")
    assert gpus.ok and gpus.message.startswith("64 GPUs placed")
    assert "rack-a (4 nodes x 8 GPUs): trainer 4 pods = 32; 32 of 32" in gpus.message
    assert "rack-b (4 nodes x 8 GPUs): rollout 8 pods = 32; 32 of 32" in gpus.message
    # Unpinned replicas fit too when the skew lets all 8 sit in rack-b (8 - 0 <= 8), not at skew 7.
    (loose,) = _findings({"topology": {"rolloutRacks": [], "rolloutMaxSkew": 8}}, "gpus")
    assert loose.ok and "rack-b (4 nodes x 8 GPUs): rollout 8 pods = 32" in loose.message
    assert "room for 0, 8" in _failed({"topology": {"rolloutRacks": [], "rolloutMaxSkew": 7}}, "gpus")


@pytest.mark.parametrize("over, message", [
    # The old file: 8 trainer pods x 8 + 8 replicas x 4 = 96 GPUs against a stated 64.
    ({"trainer": {"pods": 8}}, "the run asks for 96 GPUs (trainer 8 pods x 8 + rollout 8 replicas x 1 pods x 4 at "
                               "most) but sizing.totalGPUs says 64"),
    # 5 x 8 = 40 GPUs of trainer for a 4 x 8 = 32-GPU rack.
    ({"trainer": {"pods": 5}, "sizing": {"totalGPUs": 0}}, "the trainer's 5 pods x 8 GPUs do not fit in rack-a"),
    # Replicas unpinned, spread within skew 1 over both racks: rack-a is full with the trainer (room 0), so rack-b
    # (room 4 nodes x 8 / 4 = 8) may take only 1.
    ({"topology": {"rolloutRacks": []}}, "8 replicas of 1 pods x 4 GPUs cannot spread over rack-a, rack-b within "
                                         "topology.rolloutMaxSkew 1: room for 0, 8 beside the rest"),
    # An HPA that may grow to 10 replicas: 32 + 40 GPUs.
    ({"rollout": {"hpa": {"enabled": True, "minReplicas": 8, "maxReplicas": 10}}}, "the run asks for 72 GPUs"),
    # A spare needs a node of its own in rack-a, whose 4 nodes the trainer fills.
    ({"spares": {"count": 1}}, "1 spares (a node each, beside the trainer's 4 pods) do not fit in rack-a"),
    ({"rollout": {"gpusPerReplica": 16}, "sizing": {"totalGPUs": 0}},
     "rollout.gpusPerReplica=16 is more than a node's 8 GPUs"),
    ({"sizing": {"gpusPerNode": 0}}, "sizing.gpusPerNode not stated"),
], ids=["total", "trainer-rack", "spread", "hpa", "spare", "node", "unstated"])
def test_gpus_that_do_not_add_up_are_refused(over: dict, message: str) -> None:
    assert message in _failed(over, "gpus")


def test_the_kv_pool_must_hold_the_batch_in_flight() -> None:
    in_flight = 256 * (1024 + 4096)
    # The default --max-total-tokens (4096) caps the pool far below 1,310,720 tokens.
    no_cap = _failed({"runConfig": {"rollout": {"sglang": {"max_total_tokens": 4096}}}}, "kv_pool")
    assert "holds at most 4096 tokens per replica" in no_cap and f"= {in_flight} tokens are in flight" in no_cap
    # A 24 GiB GPU: 0.85 x 24 GiB less the weights' quarter, over 14,336 B a token.
    room = int((0.85 * 24 * GiB - QWEN7_BF16 / 4) // QWEN7_KV_PER_TOKEN_TP4)
    assert room < in_flight
    small = _failed({"sizing": {"gpuMemoryGiB": 24}}, "kv_pool")
    assert f"holds at most {room} tokens per replica" in small
    (ok,) = _findings({}, "kv_pool")
    assert ok.ok and f"{QWEN7_KV_PER_TOKEN_TP4} B per token" in ok.message


def test_read_back_is_refused_with_tensor_parallel_and_for_big_models() -> None:
    from rlfleet.chart.sizing import READ_BACK_MAX_BF16_GB, READ_BACK_SECONDS_PER_BF16_GB

    read_back = {"runConfig": {"rollout": {"sglang": {"verify": "read_back"}}}}
    assert "verify read_back with tp 4" in _failed(read_back, "read_back")
    # tp 1 over one-GPU replicas: only the size rule is left.
    tp1 = merge(read_back, {"rollout": {"replicas": 32, "gpusPerReplica": 1}})
    big = _failed(tp1, "read_back")
    assert "with tp" not in big
    assert f"~{QWEN7_BF16 / 1e9 * READ_BACK_SECONDS_PER_BF16_GB:.0f} s per weight version for 15.2 GB" in big
    assert f"above the {READ_BACK_MAX_BF16_GB:g} GB limit" in big and "sizing.acceptSlowReadBack: true" in big
    assert all(f.ok for f in _findings(merge(tp1, {"sizing": {"acceptSlowReadBack": True}}), "read_back"))
    # A model under the limit reads back.
    small_b = READ_BACK_MAX_BF16_GB / 2 / 2         # half the limit in GB, 2 bytes per parameter
    assert all(f.ok for f in _findings(merge(tp1, {"sizing": {"model": {"paramsB": small_b}}}), "read_back"))


@pytest.mark.parametrize("over, message", [
    ({"runConfig": {"rollout": {"sglang": {"tp": 8}}}}, "runConfig.rollout.sglang.tp=8 but a replica has 4 GPUs"),
    # 8-GPU replicas of a 28-head model: 28 / 8 is not whole.
    ({"rollout": {"replicas": 4, "gpusPerReplica": 8}, "runConfig": {"rollout": {"sglang": {"tp": 8}}}},
     "28 attention heads do not divide over tp 8"),
    ({"rollout": {"leaderWorkerSet": {"enabled": True, "size": 2, "workerCommand": ["sglang", "--tp", "4"]}},
      "runConfig": {"rollout": {"sglang": {"tp": 8}}}, "sizing": {"totalGPUs": 0}},
     "workerCommand runs --tp 4 but a replica has 8 GPUs"),
    ({"runConfig": {"trainer": {"backend": "megatron", "megatron": {"tensor_parallel": 16}}}},
     "tensor_parallel=16 does not divide the 8 ranks of a trainer pod"),
], ids=["tp-vs-gpus", "heads", "lws-workers", "megatron"])
def test_tensor_parallel_must_match_the_gpus(over: dict, message: str) -> None:
    assert message in _failed(over, "tensor_parallel")


def test_memory_requests_must_hold_the_model() -> None:
    # 20 GiB = 21.5 GB < 2 x 15.24 GB.
    msg = _failed({"rollout": {"resources": {"requests": {"memory": "20Gi"}}}}, "memory")
    assert "rollout.resources.requests.memory 20Gi is less than 2 x the model's bf16 size 15.2 GB = 30.5 GB" in msg
    # 40 GB < 3 x 15.24 GB.
    msg = _failed({"trainer": {"resources": {"requests": {"memory": "40G"}}}}, "memory")
    assert "trainer.resources.requests.memory 40G is less than 3 x" in msg
    # 200B parameters x 16 B over 32 ranks = 100 GB per GPU > 80 GiB (85.9 GB); the hosts are made big enough.
    huge = {"sizing": {"model": {"paramsB": 200}}, "trainer": {"resources": {"requests": {"memory": "2Ti"}}},
            "rollout": {"resources": {"requests": {"memory": "1Ti"}}}}
    msg = _failed(huge, "memory")
    assert "over 32 ranks are 100.0 GB per GPU, more than its 80 GiB" in msg
    assert "sizing.model.paramsB not stated" in _failed({"sizing": {"model": {"paramsB": 0}}}, "memory")


def test_the_command_exits_2_on_a_failing_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  pods: 8\n")
    assert main(["chart-check", str(GPU), str(bad)]) == 2
    out = capsys.readouterr().out
    assert "FAIL gpus: the run asks for 96 GPUs" in out and out.rstrip().endswith("1 failed")
    assert main(["chart-check", str(GPU)]) == 0


def test_the_docs_state_the_read_back_figure_and_limit_the_check_uses() -> None:
    from rlfleet.chart.sizing import READ_BACK_MAX_BF16_GB, READ_BACK_SECONDS_PER_BF16_GB

    docs = " ".join((VALUES.parents[1] / "docs" / "cluster.md").read_text().split())
    assert f"{READ_BACK_SECONDS_PER_BF16_GB:g} CPU seconds per GB of bf16 weights" in docs
    assert f"refused above **{READ_BACK_MAX_BF16_GB:g} GB of bf16 weights" in docs
