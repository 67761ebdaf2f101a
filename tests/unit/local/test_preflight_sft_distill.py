"""`rlfleet check` of an SFT run on labelled rows (rollout_fn labelled) and of a distillation run: rows without a
target and a missing teacher are each refused in one line naming the cause; a dataset with its label column checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.local.test_preflight import check, model_dir, write_case

__all__ = ["model_dir"]       # the module fixture, shared

LABELLED = "rlfleet.services.rollout.labelled:labelled"


def test_labelled_rows_check(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_case(tmp_path, model_dir, rollout__rollout_fn=LABELLED, rollout__group_size=1,
                        trainer__algorithm="sft")
    assert check(config, capsys) == (0, "")


def test_rows_without_a_label_are_refused(tmp_path: Path, model_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = write_case(tmp_path, model_dir, rollout__rollout_fn=LABELLED, rollout__group_size=1,
                        trainer__algorithm="sft", rollout__data__label_field=None)
    code, err = check(config, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "trains on labelled rows, but the rollout data: row 0 has no target for supervised fine-tuning" in err, err


def test_a_missing_teacher_is_refused(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_case(tmp_path, model_dir, trainer__algorithm="distill",
                        trainer__teacher__model_path=str(tmp_path / "no_teacher"))
    code, err = check(config, capsys)
    assert code == 2 and f"trainer.teacher.model_path: {tmp_path / 'no_teacher'} does not exist" in err, err


def test_a_teacher_with_the_students_vocabulary_checks(tmp_path: Path, model_dir: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    config = write_case(tmp_path, model_dir, trainer__algorithm="distill", trainer__teacher__model_path=str(model_dir))
    assert check(config, capsys) == (0, "")
