"""rlfleet: reinforcement-learning post-training of LLMs as four services (rollout, buffer, trainer, weight sync).

The public API, all a user's plugin (reward, rollout function, loss, estimator, filter, data source, hooks, model
spec) needs to import; everything else in the package may move between releases:

    rlfleet.protocols   the plugin contracts: RewardFn, RolloutFn, RolloutContext, SampleFilter, DataSource, LossFn,
                        AdvantageEstimator, TrainerHooks, ModuleReplacement, RouterScoreFn, TrainBatch, Prompt,
                        Generation, SamplingParams, ...
    rlfleet.sample      Sample, Status, RoutedExperts: the unit of data a rollout function yields
    rlfleet.config      Config, load_config and the section models: the run config (one YAML file)
    rlfleet.rewards     Scorer, batched and the stock rewards by name (rlfleet.rewards.stock)
    rlfleet.plugins     load_callable: how a dotted path in the config is imported and checked against its Protocol
    rlfleet.cli         the `rlfleet` command (run, check, scale, convert, buffer)

The rest is the SDK the services share (runtime/, run_dir/, weights/, data/, security/, local/, cpu_kernels/,
model_specs/) and the services themselves (services/); docs/architecture.md maps every folder.
"""

__version__ = "0.1.0"
