"""Start-up checks of everything a config names, before any service starts: ONE path shared by `rlfleet check` and
`rlfleet run` (run calls check_run first), so a config that checks is a config that starts.

It imports plugins with the import path the services get (the current folder first, as the launcher sets
PYTHONPATH), runs the trainer's config-only start-up checks (rlfleet/config/trainer_checks.py), checks the model
folder or GGUF file and a distillation teacher's vocabulary against it, opens every dataset file (fields, rows;
labelled rows for a rollout function that trains on labels), and resolves the reward, algorithm, advantage and loss
names.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rlfleet.config import Config, advantage_name, check_trainer, needs_reward_baseline, needs_teacher
from rlfleet.plugins import PluginError, load_callable, load_hooks
from rlfleet.protocols import (
    AdvantageEstimator,
    DataSource,
    LossFn,
    ModelPrepareFn,
    ReadsLabels,
    RolloutFn,
    SampleFilter,
    SuppliesRewardBaselines,
)


def plugin_import_path() -> str:
    """The folder the services import plugins from first: the launcher's current folder (rlfleet.local.launcher puts it
    first on the services' PYTHONPATH)."""
    return os.getcwd()


def use_plugin_import_path() -> None:
    folder = plugin_import_path()
    if folder not in sys.path:
        sys.path.insert(0, folder)


def check_model(cfg: Config) -> None:
    """model.path must be an HF folder, a GGUF file or an installed model package (rlfleet/weights/model_packages.py),
    unless model.prepare builds it at start-up."""
    from rlfleet.weights.model_packages import check_model_package
    from rlfleet.weights.model_source import ModelError, check_model

    if cfg.model.prepare and not cfg.model_path.exists():
        return
    try:
        check_model_package(cfg.model_path)
        check_model(cfg.model_path)
    except ModelError as exc:
        raise PluginError(str(exc)) from None


def check_teacher(cfg: Config) -> None:
    """A distillation teacher (trainer.teacher.model_path) must be a model folder with the student's vocabulary
    (rlfleet/weights/vocabulary.py). A student that model.prepare has not built yet is checked by the trainer."""
    from rlfleet.weights.model_source import ModelError, check_model_folder
    from rlfleet.weights.vocabulary import check_same_vocabulary

    teacher = cfg.trainer.teacher.model_path
    if not needs_teacher(cfg.trainer) or not teacher:
        return
    try:
        try:
            check_model_folder(Path(teacher))
        except ModelError as exc:
            raise ModelError(f"trainer.teacher.model_path: {exc}".replace("model.path ", "")) from None
        if (cfg.model_path / "config.json").is_file():
            check_same_vocabulary(cfg.model_path, teacher)
    except ModelError as exc:
        raise PluginError(str(exc)) from None


def _check_source(source: object, what: str) -> None:
    if not isinstance(source, DataSource):
        raise PluginError(f"{what}: returned {type(source).__name__}, which has no __len__/__getitem__")
    if len(source) == 0:
        raise PluginError(f"{what}: the data source is empty")
    source[0]


def check_data(cfg: Config) -> None:
    from rlfleet.data.files import DataError, eval_source, rollout_source

    for what, make in (("rollout data", rollout_source), ("eval data", eval_source)):
        try:
            source = make(cfg)
        except DataError as exc:
            raise PluginError(str(exc)) from None
        if source is not None:
            _check_source(source, what)


LABEL_PROBE_ROWS = 16


def check_labels(cfg: Config) -> None:
    """A rollout function that trains on labels (ReadsLabels, e.g. the data replica's `labelled`): the first rows of
    the rollout data must each hold a target (rlfleet/data/labels.py)."""
    from rlfleet.data.files import DataError, rollout_source
    from rlfleet.data.labels import LabelError, check_labelled

    try:
        source = rollout_source(cfg)
        for i in range(min(len(source), LABEL_PROBE_ROWS)):
            check_labelled(source[i], f"rollout.rollout_fn {cfg.rollout.rollout_fn} trains on labelled rows, but the "
                                      "rollout data")
    except (DataError, LabelError) as exc:
        raise PluginError(str(exc)) from None


def check_rewards(cfg: Config) -> None:
    from rlfleet.rewards.scorer import resolve_reward

    resolve_reward(cfg.rollout.reward_fn, cfg.rollout.reward_args, "rollout.reward_fn")
    if cfg.has_eval:
        name, args = cfg.eval_reward
        resolve_reward(name, args, "eval.reward_fn")


def start_algorithm_check() -> subprocess.Popen[str]:
    """The trainer resolves its own names (rlfleet/services/trainer/check_algorithm.py) in a child process, which
    imports the trainer's modules (~1.3 s) before it reads the trainer section: started first, it imports while this
    process checks the plugins."""
    return subprocess.Popen([sys.executable, "-m", "rlfleet.services.trainer.check_algorithm"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_algorithm_check(proc: subprocess.Popen[str], cfg: Config) -> None:
    _, err = proc.communicate(cfg.trainer.model_dump_json())
    if proc.returncode != 0:
        err = err.strip()
        raise PluginError(f"trainer: {err.splitlines()[-1] if err else 'refused'}")


def check_run(cfg: Config, trainer_check: Callable[[str], str | None] | None = None) -> None:
    """Everything `rlfleet run` needs before it starts services; raises PluginError naming the first problem, or
    ConfigError for a trainer section the trainer would refuse at start-up (rlfleet.config.check_trainer).

    trainer_check: asks an interpreter that has the trainer's modules imported already (a warm trainer,
    rlfleet/local/warm_interpreters.py) for the algorithm check: the reason, "" when it passes, None when it cannot
    answer
    (then a child process checks, as without it)."""
    use_plugin_import_path()
    check_trainer(cfg)          # the trainer's own start-up refusals, the same function it calls
    algorithm = start_algorithm_check() if trainer_check is None else None
    try:
        check_model(cfg)
        check_teacher(cfg)
        check_plugins(cfg)
    except BaseException:
        if algorithm is not None:
            algorithm.kill()
            algorithm.communicate()
        raise
    if algorithm is None:
        assert trainer_check is not None
        reason = trainer_check(cfg.trainer.model_dump_json())
        if reason:
            raise PluginError(f"trainer: {reason}")
        if reason is not None:
            return
        algorithm = start_algorithm_check()
    finish_algorithm_check(algorithm, cfg)


def check_reward_baselines(cfg: Config, rollout_fn: RolloutFn) -> None:
    """An estimator that reads a greedy baseline reward per group (ReMax: AdvantageSpec.needs_reward_baseline) needs
    a rollout function that declares it supplies one (SuppliesRewardBaselines: the built-in single_turn does; an
    agent's rollout function, or the data replica's labelled SFT rows, do not)."""
    if not needs_reward_baseline(cfg.trainer):
        return
    if isinstance(rollout_fn, SuppliesRewardBaselines) and rollout_fn.supplies_reward_baselines:
        return
    raise PluginError(f"trainer advantage {advantage_name(cfg.trainer)} needs a greedy (temperature 0) response per "
                      "prompt scored as the reward baseline of its group, and rollout.rollout_fn "
                      f"{cfg.rollout.rollout_fn} does not supply one (it does not declare supplies_reward_baselines; "
                      "the built-in rlfleet.services.rollout.rollout_fns:single_turn does)")


def check_plugins(cfg: Config) -> None:
    """Import and check every dotted path and name in cfg; raise PluginError naming the first one that fails."""
    check_rewards(cfg)
    rollout_fn = load_callable(cfg.rollout.rollout_fn, "rollout.rollout_fn", RolloutFn)
    check_data(cfg)
    if isinstance(rollout_fn, ReadsLabels) and rollout_fn.needs_labels:
        check_labels(cfg)
    check_reward_baselines(cfg, rollout_fn)
    if cfg.model.prepare:
        load_callable(cfg.model.prepare, "model.prepare", ModelPrepareFn)
    for path in cfg.buffer.filters:
        if ":" in path:
            load_callable(path, "buffer.filters", SampleFilter)
    if cfg.trainer.advantage and ":" in cfg.trainer.advantage:
        load_callable(cfg.trainer.advantage, "trainer.advantage", AdvantageEstimator)
    if cfg.trainer.loss and ":" in cfg.trainer.loss:
        load_callable(cfg.trainer.loss, "trainer.loss", LossFn)
    load_hooks(list(cfg.trainer.hooks))
    if cfg.model.specs or cfg.model.router_scores:
        from rlfleet.model_specs import check_model_specs

        # targets are checked on the model's architecture when its folder is there (model.prepare may build it)
        folder = cfg.model_path if cfg.model_path.is_dir() else None
        check_model_specs(list(cfg.model.specs), dict(cfg.model.router_scores), folder)
