"""Two engines that must generate alike: the same ids, logprobs within 1e-5, for every request of every sampling."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlfleet.protocols import SamplingParams
from rlfleet.services.rollout.engines.torch_engine import TorchEngine


def assert_engines_agree(first: TorchEngine, second: TorchEngine, prompts: Sequence[Sequence[int]],
                         samplings: Sequence[SamplingParams],
                         per_request: Callable[[SamplingParams, int], SamplingParams]) -> None:
    """Submit every prompt to both engines under each sampling (request i gets per_request(sampling, i), e.g. its
    own length so rows finish at different steps) and compare the generations pairwise."""
    for sampling in samplings:
        runs = [[e.submit(p, per_request(sampling, i)) for i, p in enumerate(prompts)] for e in (first, second)]
        for a, b in zip(*runs, strict=True):
            ga, gb = a.result(timeout=60), b.result(timeout=60)
            assert ga.output_ids == gb.output_ids
            assert torch.allclose(torch.tensor(ga.logprobs), torch.tensor(gb.logprobs), atol=1e-5, rtol=0)
