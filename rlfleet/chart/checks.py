"""The values checks, one function each (Stack -> findings), run in order by run_checks. Every rule and the source
of its numbers: rlfleet/chart/sizing.py and docs/cluster.md "Checking values before install"."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlfleet.chart import sizing as sz
from rlfleet.chart.placement import demand, place
from rlfleet.chart.values import CHART, Rendered, load_values, rendered


@dataclass(frozen=True)
class Finding:
    """One check's verdict on the stack: ok, or what is wrong and what to change."""

    check: str
    ok: bool
    message: str


@dataclass(frozen=True)
class Stack:
    """A merged stack of values, what the check knows about the cluster and model, and the run config it renders."""

    values: dict[str, Any]
    sizing: sz.Sizing
    run: Rendered

    @property
    def any_gpu(self) -> bool:
        return int(self.values["trainer"]["gpusPerPod"]) > 0 or int(self.values["rollout"]["gpusPerReplica"]) > 0

    @property
    def sglang_gpu(self) -> bool:
        return self.run.gpu_rollout and self.run.rollout.engine == "sglang"

    @property
    def gpus_per_replica(self) -> int:
        lws = self.values["rollout"]["leaderWorkerSet"]
        return int(self.values["rollout"]["gpusPerReplica"]) * (int(lws["size"]) if lws["enabled"] else 1)


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def _missing(keys: dict[str, float]) -> Finding | None:
    absent = [k for k, v in keys.items() if not v]
    return Finding("sizing", False, f"sizing.{', sizing.'.join(absent)} not stated: a GPU stack must say them "
                   "(deploy/helm/rlfleet/values.yaml `sizing`)") if absent else None


def check_gpus(stack: Stack) -> list[Finding]:
    """GPUs per node and per rack add up; the run's total equals sizing.totalGPUs when stated."""
    if not stack.any_gpu:
        return [Finding("gpus", True, "no GPUs asked for")]
    s = stack.sizing
    if (bad := _missing({"gpusPerNode": s.gpus_per_node, "racks": len(s.racks)})) is not None:
        return [bad]
    t, r = stack.values["trainer"], stack.values["rollout"]
    out = [Finding("gpus", False, f"{key}={n} is more than a node's {s.gpus_per_node} GPUs (sizing.gpusPerNode): "
                   "a pod runs on one node") for key, n in (("trainer.gpusPerPod", int(t["gpusPerPod"])),
                                                            ("rollout.gpusPerReplica", int(r["gpusPerReplica"])))
           if n > s.gpus_per_node]
    d = demand(stack.values, list(s.racks))
    if s.total_gpus and d.run_gpus != s.total_gpus:
        out.append(Finding("gpus", False, f"the run asks for {d.run_gpus} GPUs (trainer {d.trainer_pods} pods x "
                           f"{d.trainer_gpus} + rollout {d.replicas} replicas x {d.pods_per_replica} pods x "
                           f"{d.replica_pod_gpus} at most) but sizing.totalGPUs says {s.total_gpus}"))
    if out:
        return out
    layout, line = place(d, s.racks, s.gpus_per_node)
    if layout is None:
        return [Finding("gpus", False, f"no placement fits the racks: {line}")]
    return [Finding("gpus", True, f"{d.run_gpus} GPUs placed: {line}")]


def check_kv_pool(stack: Stack) -> list[Finding]:
    """SGLang's KV pool holds max_batch_size sequences of promptTokens + max_new_tokens at once."""
    if not stack.sglang_gpu:
        return [Finding("kv_pool", True, "no SGLang replica on GPUs")]
    s, m, ro = stack.sizing, stack.sizing.model, stack.run.rollout
    if (bad := _missing({"gpuMemoryGiB": s.gpu_memory_gib, "promptTokens": s.prompt_tokens,
                         "model.paramsB": m.params_b, "model.layers": m.layers,
                         "model.kvHeads": m.kv_heads, "model.headDim": m.head_dim})) is not None:
        return [bad]
    sg = ro.sglang
    pool = sz.kv_pool_tokens(m, s.gpu_memory_gib, sg.mem_fraction_static, sg.tp, sg.max_total_tokens)
    need = ro.max_batch_size * (s.prompt_tokens + ro.sampling.max_new_tokens)
    how = (f"min(max_total_tokens {sg.max_total_tokens}, ({sg.mem_fraction_static} x {s.gpu_memory_gib:g} GiB - "
           f"{_gb(m.bf16_bytes)} bf16 weights / tp {sg.tp}) / {m.kv_bytes_per_token(sg.tp)} B per token)")
    if pool < need:
        return [Finding("kv_pool", False, f"SGLang's KV pool holds at most {pool} tokens per replica ({how}) but "
                        f"max_batch_size {ro.max_batch_size} x (promptTokens {s.prompt_tokens} + max_new_tokens "
                        f"{ro.sampling.max_new_tokens}) = {need} tokens are in flight at once: raise "
                        "runConfig.rollout.sglang.max_total_tokens (or mem_fraction_static, or tp), or lower "
                        "max_batch_size or max_new_tokens")]
    return [Finding("kv_pool", True, f"KV pool {pool} tokens ({how}) >= {need} in flight")]


def check_read_back(stack: Stack) -> list[Finding]:
    """verify read_back: only with tp 1, and only up to READ_BACK_MAX_BF16_GB of weights (or the named override)."""
    ro = stack.run.rollout
    if ro.engine != "sglang" or ro.sglang.verify != "read_back":
        return [Finding("read_back", True, "no SGLang read-back")]
    out = []
    if ro.sglang.tp > 1:
        out.append(Finding("read_back", False, f"verify read_back with tp {ro.sglang.tp}: SGLang 0.5.23's "
                           "/get_weights_by_name answers only the first GPU's shard of tensor-parallel weights "
                           "(q/k/v, gate/up, embeddings), so the read-back never matches: set "
                           "runConfig.rollout.sglang.verify: sent"))
    m = stack.sizing.model
    if not m.params_b:
        if stack.sglang_gpu:
            out.append(Finding("read_back", False, "verify read_back on GPUs: sizing.model.paramsB not stated, so "
                               "its cost cannot be checked"))
        return out or [Finding("read_back", True, "model size not stated (CPU): read-back not sized")]
    secs = sz.read_back_seconds(m)
    cost = (f"~{secs:.0f} s per weight version for {_gb(m.bf16_bytes)} of bf16 weights "
            f"({sz.READ_BACK_SECONDS_PER_BF16_GB:g} s per GB, bench/read_back_cost.py)")
    if m.bf16_bytes / 1e9 > sz.READ_BACK_MAX_BF16_GB and not stack.sizing.accept_slow_read_back:
        out.append(Finding("read_back", False, f"verify read_back reads every tensor back as JSON: {cost}, above "
                           f"the {sz.READ_BACK_MAX_BF16_GB:g} GB limit ({sz.READ_BACK_MAX_SECONDS:g} s): set "
                           "runConfig.rollout.sglang.verify: sent, or sizing.acceptSlowReadBack: true"))
    return out or [Finding("read_back", True, cost)]


_TP_FLAG = re.compile(r"--tp(?:-size)?[ =](\d+)")


def check_tensor_parallel(stack: Stack) -> list[Finding]:
    """SGLang's tp equals a replica's GPUs (LeaderWorkerSet workers' --tp too) and splits the model's heads;
    Megatron's tensor-parallel group fits in a trainer pod."""
    out = []
    if stack.sglang_gpu:
        gpus, tp = stack.gpus_per_replica, stack.run.rollout.sglang.tp
        where = "rollout.gpusPerReplica" + (" x leaderWorkerSet.size"
                                            if stack.values["rollout"]["leaderWorkerSet"]["enabled"] else "")
        if tp != gpus:
            out.append(Finding("tensor_parallel", False, f"runConfig.rollout.sglang.tp={tp} but a replica has {gpus} "
                               f"GPUs ({where}): tp must equal them (fewer leaves GPUs idle, more cannot start)"))
        if stack.sizing.model.heads and (why := sz.heads_split(stack.sizing.model, tp)):
            out.append(Finding("tensor_parallel", False, f"runConfig.rollout.sglang.tp={tp}: {why} (SGLang refuses "
                               "to start)"))
        lws = stack.values["rollout"]["leaderWorkerSet"]
        if lws["enabled"]:
            flags = _TP_FLAG.findall(" ".join(str(a) for a in lws.get("workerCommand") or []))
            if not flags:
                out.append(Finding("tensor_parallel", False, "rollout.leaderWorkerSet.workerCommand names no --tp: "
                                   f"the workers' server must run --tp {gpus} like the leader's"))
            out += [Finding("tensor_parallel", False, f"rollout.leaderWorkerSet.workerCommand runs --tp {f} but a "
                            f"replica has {gpus} GPUs ({where})") for f in flags if int(f) != gpus]
    t = stack.run.trainer
    if t.backend == "megatron" and stack.run.trainer_ranks_per_pod % t.megatron.tensor_parallel:
        out.append(Finding("tensor_parallel", False, f"trainer.megatron.tensor_parallel={t.megatron.tensor_parallel}"
                           f" does not divide the {stack.run.trainer_ranks_per_pod} ranks of a trainer pod: a "
                           "tensor-parallel group would span pods"))
    return out or [Finding("tensor_parallel", True, "tensor parallelism matches the GPUs")]


def check_memory(stack: Stack) -> list[Finding]:
    """Pods' memory requests and GPU memory against the model's bf16 size (sizing.py states each rule)."""
    m, s = stack.sizing.model, stack.sizing
    if not m.params_b:
        if stack.any_gpu:
            return [Finding("memory", False, "sizing.model.paramsB not stated: a GPU stack must say it")]
        return [Finding("memory", True, "model size not stated (CPU): memory not sized")]
    bf16, out = m.bf16_bytes, []
    for side, copies, why in (("trainer", sz.TRAINER_HOST_BF16_COPIES, "rank 0 gathers the fp32 state and its bf16 "
                               "copy to export a checkpoint"),
                              ("rollout", sz.ROLLOUT_HOST_BF16_COPIES, "the version being fetched and the last one "
                               "sent")):
        asked = (stack.values[side].get("resources") or {}).get("requests", {}).get("memory")
        if asked is None or sz.memory_bytes(asked) < copies * bf16:
            out.append(Finding("memory", False, f"{side}.resources.requests.memory {asked or '(unset)'} is less "
                               f"than {copies} x the model's bf16 size {_gb(bf16)} = {_gb(copies * bf16)} ({why})"))
    world = stack.run.trainer.world_size
    if stack.run.gpu_trainer and s.gpu_memory_gib:
        per_gpu = sz.TRAINER_STATE_BYTES_PER_PARAM * m.params_b * 1e9 / world
        if per_gpu > s.gpu_memory_gib * sz.GiB:
            out.append(Finding("memory", False, f"the trainer's weights, gradients and Adam state "
                               f"({sz.TRAINER_STATE_BYTES_PER_PARAM} B per parameter = "
                               f"{_gb(sz.TRAINER_STATE_BYTES_PER_PARAM * m.params_b * 1e9)}) over {world} ranks are "
                               f"{_gb(per_gpu)} per GPU, more than its {s.gpu_memory_gib:g} GiB"))
    if stack.sglang_gpu and s.gpu_memory_gib:
        sg = stack.run.rollout.sglang
        if bf16 / sg.tp > sg.mem_fraction_static * s.gpu_memory_gib * sz.GiB:
            out.append(Finding("memory", False, f"the bf16 weights over tp {sg.tp} are {_gb(bf16 / sg.tp)} per GPU, "
                               f"more than mem_fraction_static {sg.mem_fraction_static} of {s.gpu_memory_gib:g} GiB"))
    return out or [Finding("memory", True, f"memory requests hold the model ({_gb(bf16)} bf16)")]


CHECKS: dict[str, Callable[[Stack], list[Finding]]] = {
    "gpus": check_gpus, "kv_pool": check_kv_pool, "read_back": check_read_back,
    "tensor_parallel": check_tensor_parallel, "memory": check_memory,
}


def stack_of(values: dict[str, Any]) -> Stack:
    return Stack(values, sz.Sizing.from_values(values), rendered(values))


def run_checks(files: Sequence[Path], chart: Path = CHART) -> list[Finding]:
    """Every check over the files merged (in order) over the chart's values.yaml."""
    stack = stack_of(load_values(files, chart))
    return [f for check in CHECKS.values() for f in check(stack)]
