"""The held-out eval waits for a replica that has never answered as long as the launcher waits for replicas to
start (an SGLang replica on a busy CPU takes 50-60 s), and only the usual patience once it has answered."""

from __future__ import annotations

from typing import cast

from rlfleet.services.trainer import evaluation
from rlfleet.services.trainer.clients import PATIENCE, RolloutClient
from rlfleet.v1 import rollout_pb2


class _Client:
    address = "127.0.0.1:1"

    def __init__(self) -> None:
        self.patience: list[float] = []

    def generate(self, request: rollout_pb2.GenerateRequest, timeout: float,
                 patience: float = PATIENCE) -> rollout_pb2.GenerateReply:
        self.patience.append(patience)
        return rollout_pb2.GenerateReply(generations=[rollout_pb2.Generation() for _ in request.input_ids])


def test_first_generate_waits_for_startup_then_usual_patience() -> None:
    ev = evaluation.Evaluator.__new__(evaluation.Evaluator)
    ev.encoded = [[1, 2], [3, 4], [5, 6]]
    ev.sampling = rollout_pb2.SamplingParams()
    ev.batch_size = 2
    ev._answered = set()
    ev._progress = None                              # no evaluation phase reported (what __init__ sets)
    client = _Client()
    as_client = cast(RolloutClient, client)          # the one method Evaluator uses, over no channel
    assert len(ev._generate(as_client, [0, 1, 2], version=0)) == 3
    ev._generate(as_client, [0], version=1)
    # the first call's requests (sent at once, in parts: evaluation.PROGRESS_PARTS) all wait for the replica's
    # start-up; once it answered, the next call has the usual patience
    first_parts = len(client.patience) - 1
    assert first_parts == min(3, evaluation.PROGRESS_PARTS)
    assert client.patience == [evaluation.STARTUP_PATIENCE] * first_parts + [PATIENCE]
    assert evaluation.STARTUP_PATIENCE >= 300 > PATIENCE
