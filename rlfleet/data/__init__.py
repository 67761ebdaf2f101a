"""Prompt datasets by path (files.py): JSONL, Parquet or a saved `datasets` folder served as a DataSource with a seeded
order and a held-out split; every row checked when the file is opened."""
