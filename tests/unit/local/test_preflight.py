"""`rlfleet check` checks what `rlfleet run` needs, through the one path both use (rlfleet.local.preflight.check_run):
plugins in the current folder, the model folder or GGUF file, dataset fields, reward and algorithm names. Each bad
input gets a short error naming its cause, and a refused run touches nothing in its run folder."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlfleet.cli import main
from rlfleet.config import load_config
from rlfleet.local.launcher import run
from rlfleet.plugins import PluginError
from tests.support.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def write_case(tmp: Path, model: Path, **changes: object) -> Path:
    (tmp / "data.jsonl").write_text('{"q": "1+1=", "a": "2"}\n{"q": "2+2=", "a": "4"}\n')
    data: dict[str, Any] = {"run": {"dir": str(tmp / "run")}, "model": {"path": str(model)},
            "rollout": {"data": {"path": str(tmp / "data.jsonl"), "prompt_field": "q", "label_field": "a",
                                 "chat": False}, "reward_fn": "exact_match", "group_size": 2}}
    for key, value in changes.items():
        node = data
        *parents, last = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def check(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["check", str(config)])
    return code, capsys.readouterr().err


def test_plugin_in_the_current_folder_is_found_like_run_finds_it(tmp_path: Path, model_dir: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"mathrl_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("def reward(prompt, completion, sample):\n    return 1.0\n")
    config = write_case(tmp_path, model_dir, rollout__reward_fn=f"{name}:reward")
    monkeypatch.chdir(tmp_path)
    assert check(config, capsys) == (0, "")


@pytest.mark.parametrize(("changes", "expected"), [
    ({"model__path": "{run_dir}/no_model"}, r"model.path .*no_model does not exist"),
    ({"rollout__reward_fn": "last_numbr"}, r"rollout.reward_fn 'last_numbr': unknown reward \(stock rewards"),
    ({"rollout__reward_args": {"tolerence": 1}, "rollout__reward_fn": "last_number"},
     r"options \['tolerence'\] do not fit"),
    ({"rollout__data__label_field": "answer"}, r"rollout.data: .*data.jsonl: no column 'answer' \(columns: q, a\)"),
    ({"trainer__algorithm": "grpoo"}, r"trainer.algorithm 'grpoo': unknown preset"),
    ({"eval__data": {"path": "missing.jsonl", "prompt_field": "q"}}, r"eval.data: dataset missing.jsonl does not "),
])
def test_bad_inputs_are_named(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str],
                              changes: dict, expected: str) -> None:
    code, err = check(write_case(tmp_path, model_dir, **changes), capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err              # short: one line
    assert __import__("re").search(expected, err), err


def test_empty_dataset_and_gguf_that_is_not_a_model(tmp_path: Path, model_dir: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config = write_case(tmp_path, model_dir)
    (tmp_path / "data.jsonl").write_text("\n")
    code, err = check(config, capsys)
    assert code == 2 and "data.jsonl is empty (no rows)" in err
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip file, not a model")
    code, err = check(write_case(tmp_path, fake), capsys)
    assert code == 2 and f"model.path {fake} is not a model: not a GGUF file (it starts with b'PK\\x03\\x04'" in err
    no_weights = tmp_path / "empty_model"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    code, err = check(write_case(tmp_path, no_weights), capsys)
    assert code == 2 and "holds no weights" in err


def warm_interpreters_of_this_process() -> list[int]:
    """Pids of this process's children that are still warm service interpreters (rlfleet/local/warm_interpreter.py)."""
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            ppid = int(next(x for x in status.read_text().splitlines() if x.startswith("PPid:")).split()[1])
            cmd = (status.parent / "cmdline").read_bytes()
        except (OSError, StopIteration, ValueError):
            continue
        if ppid == os.getpid() and b"rlfleet.local.warm_interpreter" in cmd:
            out.append(int(status.parent.name))
    return out


@pytest.mark.parametrize(("changes", "expected"), [
    ({"rollout__reward_fn": "no_such_reward"}, "no_such_reward"),                 # refused by the launcher
    ({"trainer__loss": "no_such_loss"}, "trainer: loss 'no_such_loss'"),        # refused by the warm trainer
])
def test_a_refused_run_loses_nothing(tmp_path: Path, model_dir: Path, changes: dict, expected: str) -> None:
    config = write_case(tmp_path, model_dir, **changes)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_3").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_3" / "meta.json").write_text(json.dumps({"step": 3}))
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    with pytest.raises(PluginError, match=expected):
        run(load_config(config), config, fresh=True)             # even --fresh: refused before anything is deleted
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
    assert warm_interpreters_of_this_process() == []            # the interpreters started early are gone
