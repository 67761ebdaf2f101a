"""`trainer.convention`: one name that sets every verl / TRL convention knob of the trainer's losses and estimators.

The same algorithm (GRPO with a KL penalty, GSPO, REINFORCE++) gives different numbers in verl and in TRL because
of small conventions: how the KL and entropy terms are aggregated, the std the whitening divides by, the epsilon of
GRPO's std, the unit GSPO's clip fraction counts, which KL is logged with a ratio-weighted KL, the empty-row rule
and the dual-clip. Each is its own trainer field; `convention: verl` or `convention: trl` fills every one of them
that the config does not set itself (a field the config sets wins). `rlfleet` (the default) leaves the fields'
own defaults. The table (docs/algorithms.md shows it side by side, tests/unit/test_conventions.py checks it) was
read from verl's core_algos.py / dp_actor.py / torch_functional.py and TRL's grpo_trainer.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

CONVENTION_NAMES = ("rlfleet", "verl", "trl")

# dotted field under trainer -> value, per convention (rlfleet: the fields' defaults, written out for the docs)
CONVENTIONS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "rlfleet": MappingProxyType({
        "kl.agg": "token-mean", "kl.logged": "plain", "policy_loss.entropy_agg": "token-mean",
        "estimator.whiten_std": "population", "estimator.std_eps": 1e-6, "estimator.single_sample": "reward",
        "gspo.clip_fraction": "sequence", "policy_loss.empty_rows": "exclude", "policy_loss.clip_ratio_c": 3.0,
    }),
    # verl: agg_loss(kld / entropy, loss_agg_mode) like the policy loss; masked_whiten with masked_var(unbiased=True);
    # GRPO epsilon 1e-6, a one-sample group's raw reward; GSPO's pg_clipfrac a token mean; seq-mean modes count rows
    # with a valid token; dual-clip 3
    "verl": MappingProxyType({
        "kl.agg": "policy", "kl.logged": "plain", "policy_loss.entropy_agg": "policy",
        "estimator.whiten_std": "bessel", "estimator.std_eps": 1e-6, "estimator.single_sample": "reward",
        "gspo.clip_fraction": "token", "policy_loss.empty_rows": "exclude", "policy_loss.clip_ratio_c": 3.0,
    }),
    # TRL: per_token_loss + beta * per_token_kl aggregated by loss_type; the entropy bonus a global token mean; the
    # logged kl is the (bias-corrected) per_token_kl; std + 1e-4 and a one-sample group's r - mean = 0;
    # sequence-level clip ratios count sequences; grpo's .mean() over every row; no dual-clip; whitening (its PPO
    # trainer's masked_whiten) unbiased
    "trl": MappingProxyType({
        "kl.agg": "policy", "kl.logged": "weighted", "policy_loss.entropy_agg": "token-mean",
        "estimator.whiten_std": "bessel", "estimator.std_eps": 1e-4, "estimator.single_sample": "zero",
        "gspo.clip_fraction": "sequence", "policy_loss.empty_rows": "include", "policy_loss.clip_ratio_c": 0.0,
    }),
})


def _as_dict(value: Any) -> dict[str, Any]:
    """A sub-section as the user gave it: a dict, or a section model's explicitly set fields."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, BaseModel):            # a section passed in code: the fields it was given
        return value.model_dump(exclude_unset=True)
    return {}


def apply_convention(section: Mapping[str, Any]) -> dict[str, Any]:
    """The raw trainer section with its convention's values filled in where the section does not set the field.

    section: the trainer section as given (before validation). An unknown convention is left for the field's own
    validation to refuse."""
    data = dict(section)
    name = str(data.get("convention", "rlfleet"))
    table = CONVENTIONS.get(name)
    if table is None or name == "rlfleet":     # rlfleet: the fields' own defaults
        return data
    for dotted, value in table.items():
        sub, field = dotted.split(".")
        given = _as_dict(data.get(sub, {}))
        if field not in given:
            given[field] = value
        data[sub] = given
    return data


def convention_values(field: str) -> dict[str, Any]:
    """{convention: value} of a convention knob by its full dotted name ("trainer.kl.agg"); {} for other fields.
    `rlfleet check --explain` prints it."""
    dotted = field.removeprefix("trainer.")
    if not field.startswith("trainer.") or dotted not in CONVENTIONS["rlfleet"]:
        return {}
    return {name: table[dotted] for name, table in CONVENTIONS.items()}
