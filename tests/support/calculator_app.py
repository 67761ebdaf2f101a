"""The OpenAI endpoint's app over the calculator example's tiny model (two-token answers), for endpoint tests."""

from __future__ import annotations

from collections.abc import Iterator

from transformers import AutoTokenizer

from rlfleet.protocols import SamplingParams
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.openai_api.app import OpenAIApp
from rlfleet.services.rollout.openai_api.sessions import SessionStore
from tests.support.calculator_model import calculator_model_dir


def calculator_app() -> Iterator[OpenAIApp]:
    """Yield the app (a torch engine of batch 2, seed 0), then shut its engine down: `yield from` it in a fixture."""
    model = calculator_model_dir()
    tok = AutoTokenizer.from_pretrained(str(model))
    engine = TorchEngine(model, max_batch_size=2, seed=0)
    yield OpenAIApp(engine, tok, SamplingParams(max_new_tokens=2), SessionStore(tok))
    engine.shutdown()
