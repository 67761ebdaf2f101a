"""Datasets by path: JSONL, Parquet and saved `datasets` folders; fields, extras, seeded epochs, held-out split, and
the errors a bad file gets (file, row and field named)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlfleet.config import DataConfig, parse_config
from rlfleet.data.files import DataError, FileDataSource, eval_source, rollout_source
from rlfleet.protocols import Prompt

ROWS = [{"question": f"q{i}", "answer": i * 2, "level": i % 3} for i in range(10)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cfg(path: Path, **kw) -> DataConfig:
    return DataConfig(path=str(path), **{"prompt_field": "question", "label_field": "answer", **kw})


def _last(p: Prompt) -> str:
    """The last message's content (the user's question)."""
    assert p.messages is not None
    return p.messages[-1]["content"]


def test_jsonl_prompt_label_and_extras(tmp_path: Path) -> None:
    src = FileDataSource(cfg(write_jsonl(tmp_path / "d.jsonl", ROWS), shuffle=False, chat=True,
                             system_prompt="be brief"))
    assert len(src) == 10
    p = src[3]
    assert p.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "q3"})
    assert p.label == "6" and dict(p.extras) == {"level": 0} and p.index == 3
    raw = FileDataSource(cfg(tmp_path / "d.jsonl", shuffle=False, chat=False, extra_fields=[]))
    assert raw[1].text == "q1" and raw[1].messages is None and dict(raw[1].extras) == {}


def test_epochs_are_reshuffled_with_the_seed(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    a, b = FileDataSource(cfg(path), run_seed=5), FileDataSource(cfg(path), run_seed=5)
    epoch0 = [a[i].text or _last(a[i]) for i in range(10)]
    epoch1 = [_last(a[i]) for i in range(10, 20)]
    assert sorted(epoch0) == sorted(epoch1) == sorted(f"q{i}" for i in range(10))   # every row once per epoch
    assert epoch0 != epoch1                                                          # a new order per epoch
    assert [_last(b[i]) for i in range(20)] == epoch0 + epoch1      # same seed, same order
    other = FileDataSource(cfg(path), run_seed=6)
    assert [_last(other[i]) for i in range(10)] != epoch0


def test_holdout_split_is_disjoint_and_default_eval(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    train = FileDataSource(cfg(path, holdout=0.3))
    held = FileDataSource(cfg(path, holdout=0.3, split="holdout"))
    assert (len(train), len(held)) == (7, 3)
    train_q = {_last(train[i]) for i in range(7)}
    held_q = {_last(held[i]) for i in range(3)}
    assert not train_q & held_q and len(train_q | held_q) == 10
    run = parse_config({"model": {"path": "m"}, "rollout": {
        "data": {"path": str(path), "prompt_field": "question", "label_field": "answer", "holdout": 3},
        "reward_fn": "exact_match"}})
    ev = eval_source(run)
    assert ev is not None and {_last(ev[i]) for i in range(3)} == held_q
    assert len(rollout_source(run)) == 7


def test_parquet_and_saved_datasets_folder(tmp_path: Path) -> None:
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "saved"))
    pq = FileDataSource(cfg(tmp_path / "d.parquet", shuffle=False))
    assert len(pq) == 10 and pq[4].label == "8"
    saved = FileDataSource(cfg(tmp_path / "saved", shuffle=False, dataset_split="test"))
    assert len(saved) == 2 and saved[1].label == "2"
    with pytest.raises(DataError, match="no split 'dev'"):
        FileDataSource(cfg(tmp_path / "saved", dataset_split="dev"))


def test_messages_field(tmp_path: Path) -> None:
    rows = [{"msgs": [{"role": "user", "content": "hi"}], "answer": "x"}]
    src = FileDataSource(DataConfig(path=str(write_jsonl(tmp_path / "m.jsonl", rows)), messages_field="msgs",
                                    label_field="answer"))
    assert src[0].messages == ({"role": "user", "content": "hi"},)
    bad = write_jsonl(tmp_path / "bad.jsonl", [*rows, {"msgs": [{"role": "user"}], "answer": "y"}])
    with pytest.raises(DataError, match=r"bad.jsonl row 2: field 'msgs'.*'content'"):
        FileDataSource(DataConfig(path=str(bad), messages_field="msgs"))


@pytest.mark.parametrize(("content", "kw", "expected"), [
    ("", {}, r"rollout.data: .*d.jsonl is empty \(no rows\)"),
    ('{"question": "a", "answer": 1}\n{"question": "b", \n', {}, r"d.jsonl row 2: not valid JSON"),
    ('{"question": "a", "answer": 1}\n', {"label_field": "solution"},
     r"d.jsonl: no column 'solution' \(columns: question, answer\)"),
    ('{"question": "a", "answer": 1}\n{"question": "", "answer": 2}\n', {},
     r"d.jsonl row 2: field 'question' is empty"),
    ('{"question": "a", "answer": 1}\n{"question": "b"}\n', {}, r"d.jsonl row 2: field 'answer' is missing"),
    ('{"question": "a", "answer": 1}\n{"answer": 2}\n', {}, r"d.jsonl row 2: field 'question' is missing"),
    ('[1, 2]\n', {}, r"d.jsonl row 1: expected a JSON object"),
])
def test_bad_files_are_refused_naming_file_row_field(tmp_path: Path, content: str, kw: dict, expected: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=expected):
        FileDataSource(cfg(path, **kw))
    assert path.read_text() == content                  # nothing is rewritten or lost


def test_missing_file_and_one_prompt_field(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        FileDataSource(cfg(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="exactly one of prompt_field and messages_field"):
        DataConfig(path="x.jsonl", prompt_field="a", messages_field="b")
