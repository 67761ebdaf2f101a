"""Datasets by path (rollout.data / eval.data): JSONL, Parquet or a saved Hugging Face `datasets` folder, read with
the `datasets` library and served as a DataSource (rlfleet.protocols) with a seeded order per epoch and a held-out
split. Every row is checked when the file is opened: a missing column, an empty file or an unreadable row is refused
with an error naming the file, the row and the field.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlfleet.config import Config, DataConfig
from rlfleet.protocols import DataSource, Prompt


class DataError(ValueError):
    """A dataset file that cannot serve prompts; the message names the file, the row and the field."""


def _read_jsonl(path: Path) -> Any:
    import datasets

    rows: list[dict[str, Any]] = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DataError(f"{path} row {lineno}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path} row {lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    if not rows:
        raise DataError(f"{path} is empty (no rows)")
    try:
        return datasets.Dataset.from_list(rows)
    except Exception as exc:  # noqa: BLE001 - pyarrow's type errors: one message for all
        raise DataError(f"{path}: rows do not share one schema ({type(exc).__name__}: {exc})") from None


def _read(path: Path, dataset_split: str) -> Any:
    import datasets

    if not path.exists():
        raise DataError(f"dataset {path} does not exist")
    if path.is_dir():
        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"{path} is not a saved `datasets` folder ({type(exc).__name__}: {exc})") from None
        if isinstance(ds, datasets.DatasetDict):
            if dataset_split not in ds:
                raise DataError(f"{path}: no split '{dataset_split}' (splits: {', '.join(ds)}); set dataset_split")
            ds = ds[dataset_split]
        return ds
    if path.suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    if path.suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        try:
            return datasets.Dataset(pq.read_table(str(path)))
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"{path} is not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    raise DataError(f"{path}: unknown dataset format (expected .jsonl, .parquet or a saved `datasets` folder)")


def _check_messages(value: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise DataError(f"{where}: expected a non-empty list of {{role, content}} messages, got {value!r:.80}")
    out = []
    for m in value:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: message {m!r:.80} needs string 'role' and 'content'")
        out.append({"role": m["role"], "content": m["content"]})
    return tuple(out)


def holdout_count(cfg: DataConfig, rows: int) -> int:
    k = int(round(cfg.holdout * rows)) if cfg.holdout < 1 else int(cfg.holdout)
    return min(k, rows)


class FileDataSource:
    """Prompts of one split of a dataset file. Index i >= len() wraps into epoch i // len(), each epoch a new seeded
    order (shuffle: true). The holdout split is a seeded choice of rows, the same in every process."""

    def __init__(self, cfg: DataConfig, run_seed: int = 0, what: str = "rollout.data") -> None:
        self.cfg, self.what = cfg, what
        self.path = Path(cfg.path)
        self.seed = run_seed if cfg.seed is None else cfg.seed
        try:
            ds = _read(self.path, cfg.dataset_split)
            if len(ds) == 0:
                raise DataError(f"{self.path} is empty (no rows)")
            self.rows = self._check(ds)
        except DataError as exc:
            raise DataError(f"{what}: {exc}") from None
        order = list(range(len(self.rows)))
        random.Random(self.seed).shuffle(order)
        k = holdout_count(cfg, len(self.rows))
        chosen = {"train": order[k:], "holdout": order[:k], "all": order}[cfg.split]
        self._ids = sorted(chosen)
        if not self._ids:
            raise DataError(f"{what}: {self.path} has {len(self.rows)} rows and holdout {cfg.holdout} leaves none in "
                            f"split '{cfg.split}'")
        self._epoch_order: tuple[int, list[int]] = (-1, [])

    def _check(self, ds: Any) -> list[dict[str, Any]]:
        """Every row as a dict, after checking the configured fields (file, row and field in each error)."""
        cfg, columns = self.cfg, list(ds.column_names)
        wanted = [f for f in (cfg.prompt_field, cfg.messages_field, cfg.label_field) if f]
        wanted += list(cfg.extra_fields or [])
        for f in wanted:
            if f not in columns:
                raise DataError(f"{self.path}: no column '{f}' (columns: {', '.join(columns)})")
        rows = ds.to_list()
        for i, row in enumerate(rows):
            where = f"{self.path} row {i + 1}"
            for f in wanted:                          # a JSONL row without the key reads as None (null)
                if row[f] is None:
                    raise DataError(f"{where}: field '{f}' is missing (or null)")
            if cfg.prompt_field:
                value = row[cfg.prompt_field]
                if not isinstance(value, str) or not value.strip():
                    raise DataError(f"{where}: field '{cfg.prompt_field}' is empty or not text ({value!r:.80})")
            else:
                row[cfg.messages_field] = _check_messages(row[cfg.messages_field],
                                                          f"{where}: field '{cfg.messages_field}'")
        return rows

    def __len__(self) -> int:
        return len(self._ids)

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_order[0] != epoch:
            order = list(self._ids)
            if self.cfg.shuffle:
                random.Random(self.seed * 1_000_003 + epoch + 1).shuffle(order)
            self._epoch_order = (epoch, order)
        return self._epoch_order[1]

    def row_of(self, index: int) -> int:
        """The file row (0-based) that prompt `index` reads."""
        epoch, pos = divmod(index, len(self._ids))
        return self._order(epoch)[pos]

    def __getitem__(self, index: int) -> Prompt:
        cfg = self.cfg
        row = self.rows[self.row_of(index)]
        used = {cfg.prompt_field, cfg.messages_field, cfg.label_field}
        names = cfg.extra_fields if cfg.extra_fields is not None else [c for c in row if c not in used]
        extras = {name: row[name] for name in names}
        label = None if cfg.label_field is None else str(row[cfg.label_field])
        system = ({"role": "system", "content": cfg.system_prompt},) if cfg.system_prompt else ()
        if cfg.messages_field:
            return Prompt(index=index, messages=system + tuple(row[cfg.messages_field]), label=label, extras=extras)
        assert cfg.prompt_field is not None       # DataConfig holds exactly one of prompt_field, messages_field
        text = row[cfg.prompt_field]
        if cfg.chat:
            return Prompt(index=index, messages=system + ({"role": "user", "content": text},), label=label,
                          extras=extras)
        return Prompt(index=index, text=(cfg.system_prompt or "") + text, label=label, extras=extras)


def rollout_source(cfg: Config) -> DataSource:
    """The training prompts: rollout.data (a file) or rollout.data_source (a dotted-path factory)."""
    from rlfleet.plugins import load_factory

    if cfg.rollout.data is not None:
        return FileDataSource(cfg.rollout.data, cfg.run.seed, "rollout.data")
    assert cfg.rollout.data_source is not None
    return load_factory(cfg.rollout.data_source, "data_source", dict(cfg.rollout.data_args))


def eval_source(cfg: Config) -> DataSource | None:
    """The held-out prompts: eval.data, eval.data_source, or rollout.data's holdout split; None when none is set."""
    from rlfleet.plugins import load_factory

    data = cfg.eval_data
    if data is not None:
        return FileDataSource(data, cfg.run.seed, "eval.data")
    if cfg.eval.data_source:
        return load_factory(cfg.eval.data_source, "eval.data_source", dict(cfg.eval.data_args))
    return None
