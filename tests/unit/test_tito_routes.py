"""TITO sessions with a MoE model (R3): the final multi-turn Sample carries, at every model token, the routes the
engine recorded in that token's turn, and FREE at the tool tokens, laid out where the trainer replays them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlfleet.protocols import Generation, GroupTicket, SamplingParams
from rlfleet.sample import FREE_ROUTE, RoutedExperts, Sample, SampleError
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.tito import TitoSession
from rlfleet.services.trainer.routing_replay import FREE, routes_tensor
from tests.support.tiny_moe import LAYERS, TOP_K, VOCAB, make_tiny_moe

torch.set_num_threads(1)
TOOL_REPLIES = ["12", "7 = 7", "0"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """A character tokenizer whose 32 ids are exactly the tiny MoE's vocabulary, with <|end|> (id 0) its only
    special token: whatever a random model emits decodes, and the chat template re-renders it unchanged."""
    chars = list("0123456789+-*= abcdefghijklmnop")[:28]
    vocab = {tok: i for i, tok in enumerate(["<|end|>", *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", clean_up_tokenization_spaces=False)
    fast.add_tokens(["<|user|>", "<|assistant|>", "<|tool|>"])
    fast.chat_template = CHAT_TEMPLATE
    assert len(fast) == VOCAB
    return fast


END = 0                                          # <|end|>: the model's stop token


@pytest.fixture(scope="module")
def session_and_turns(tmp_path_factory: pytest.TempPathFactory) -> tuple[TitoSession, list[tuple[int, Generation]]]:
    """Three engine turns with tool replies between them; each turn's (response offset, generation)."""
    engine = TorchEngine(make_tiny_moe(tmp_path_factory.mktemp("tito-moe") / "m", seed=7), max_batch_size=2)
    session = TitoSession(chat_tokenizer(), [{"role": "user", "content": "3+4*2"}])
    turns: list[tuple[int, Generation]] = []
    try:
        for i, reply in enumerate(TOOL_REPLIES):
            sampling = SamplingParams(temperature=1.0, max_new_tokens=5, stop_token_ids=(END,), seed=i)
            gen = engine.submit(session.input_ids, sampling).result(timeout=120)
            turns.append((len(session.response_ids), gen))
            session.add_generation(gen)
            session.add_messages([{"role": "tool", "content": reply}])
    finally:
        engine.shutdown()
    return session, turns


def test_each_model_token_keeps_the_routes_of_its_turn_and_tool_tokens_are_free(
        session_and_turns: tuple[TitoSession, list[tuple[int, Generation]]]) -> None:
    session, turns = session_and_turns
    sample = Sample.from_proto(session.to_sample(GroupTicket("g", 0, 1), 0).to_proto())    # through the wire
    assert sample.routed_experts is not None
    ids, mask = sample.routed_experts.ids, np.array(sample.mask)
    assert ids.shape == (len(sample.response_ids), LAYERS, TOP_K)
    covered: np.ndarray = np.zeros(len(ids), dtype=bool)
    for start, gen in turns:
        n = len(gen.output_ids)
        assert gen.routed_experts is not None and n > 0
        np.testing.assert_array_equal(ids[start:start + n], gen.routed_experts)
        covered[start:start + n] = True
    np.testing.assert_array_equal(covered, mask == 1)                  # the model tokens are exactly the turns'
    assert (ids[~covered] == FREE_ROUTE).all() and (ids[covered] >= 0).all()
    assert (~covered).sum() > len(TOOL_REPLIES)                        # tool tokens exist between the turns


def test_the_trainer_replays_each_turns_routes_at_the_positions_that_produced_its_tokens(
        session_and_turns: tuple[TitoSession, list[tuple[int, Generation]]]) -> None:
    session, turns = session_and_turns
    sample = session.to_sample(GroupTicket("g", 0, 1), 0)
    p = len(sample.prompt_ids)
    routes = routes_tensor([sample], p + len(sample.response_ids))
    assert routes is not None
    layout = routes[0].numpy()                                                              # [L, layers, K]
    expected = np.full_like(layout, FREE)
    for start, gen in turns:
        expected[p - 1 + start:p - 1 + start + len(gen.output_ids)] = gen.routed_experts
    np.testing.assert_array_equal(layout, expected)


def test_free_rows_round_trip_and_mixed_rows_are_refused() -> None:
    ids = np.array([[[1, 2]], [[FREE_ROUTE, FREE_ROUTE]], [[300, 4]]])                       # [3, 1, 2]
    msg = RoutedExperts(ids=ids).to_proto()
    assert msg.bits == 16 and msg.free_rows == bytes([0, 1, 0])
    np.testing.assert_array_equal(RoutedExperts.from_proto(msg).ids, ids)
    assert RoutedExperts(ids=ids[[0, 2]]).to_proto().free_rows == b""                      # absent when none
    with pytest.raises(SampleError, match="all FREE_ROUTE"):
        RoutedExperts(ids=np.array([[[1, FREE_ROUTE]]])).to_proto()


def test_a_dense_session_carries_no_routes() -> None:
    session = TitoSession(chat_tokenizer(), [{"role": "user", "content": "1+1"}])
    session.add_generation(Generation(output_ids=(5, 0), logprobs=(-0.1, -0.2), finish_reason="stop",
                                      weight_version=0))
    session.add_messages([{"role": "tool", "content": "2"}])
    assert session.to_sample(GroupTicket("g", 0, 1), 0).routed_experts is None


def test_a_turn_whose_routes_disagree_with_its_tokens_is_refused() -> None:
    session = TitoSession(chat_tokenizer(), [{"role": "user", "content": "1+1"}])
    bad = Generation(output_ids=(5, 0), logprobs=(-0.1, -0.2), finish_reason="stop", weight_version=0,
                     routed_experts=np.zeros((3, LAYERS, TOP_K), dtype=np.int64))
    with pytest.raises(ValueError, match="3 routes for 2 output tokens"):
        session.add_generation(bad)
