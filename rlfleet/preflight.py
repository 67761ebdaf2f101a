"""Start-up checks of every plugin a config names, before any service starts."""

from __future__ import annotations

from rlfleet.config import Config
from rlfleet.plugins import load_callable, load_factory, load_hooks
from rlfleet.protocols import DataSource


def check_plugins(cfg: Config) -> None:
    """Import and check every dotted path in cfg; raise PluginError naming the first one that fails.

    Built-in names (no ':') of losses, advantages and filters are checked by the service that owns them.
    """
    from rlfleet.plugins import PluginError

    load_callable(cfg.rollout.reward_fn, "reward_fn")
    load_callable(cfg.rollout.rollout_fn, "rollout_fn")
    sources = [("data_source", cfg.rollout.data_source, cfg.rollout.data_args)]
    if cfg.eval.data_source:
        sources.append(("eval.data_source", cfg.eval.data_source, cfg.eval.data_args))
    for what, path, args in sources:
        source = load_factory(path, what, dict(args))
        if not isinstance(source, DataSource):
            raise PluginError(f"{what} '{path}': returned {type(source).__name__}, which has no __len__/__getitem__")
        if len(source) == 0:
            raise PluginError(f"{what} '{path}': the data source is empty")
        source[0]
    if cfg.eval.reward_fn:
        load_callable(cfg.eval.reward_fn, "reward_fn")
    if cfg.model.prepare:
        load_callable(cfg.model.prepare, "model.prepare", arity=2)
    for path in cfg.buffer.filters:
        if ":" in path:
            load_callable(path, "sample_filter")
    for what, plugin in (("advantage", cfg.trainer.advantage), ("loss", cfg.trainer.loss)):
        if plugin and ":" in plugin:
            load_callable(plugin, what)
    load_hooks(list(cfg.trainer.hooks))
