"""Rewards by name (stock.py), over HTTP (remote.py), and the Scorer that calls any reward with the dataset's extra
columns as keyword arguments, a time-out, and async or batched functions (scorer.py)."""

from rlfleet.rewards.scorer import RewardFailure, Scorer, batched, load_scorer

__all__ = ["RewardFailure", "Scorer", "batched", "load_scorer"]
