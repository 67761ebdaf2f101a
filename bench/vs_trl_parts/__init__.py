"""Pieces of bench/vs_trl.py: the TRL half (run under the TRL interpreter) and the shared evaluation."""
