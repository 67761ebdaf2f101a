"""The trainer's metrics log: metrics/trainer.jsonl always, plus TensorBoard event files and a W&B run when
`dashboards:` turns them on. W&B `offline` writes RUN_DIR/wandb/offline-run-* with no network (`wandb sync` uploads
it later). Each record is one step's numbers: train records go under train/, eval/* keys keep their names."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlfleet.config import Config
from rlfleet.runtime.metrics import JsonlLog

log = logging.getLogger(__name__)

NOT_SCALARS = ("step", "time", "version", "redelivered")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """Dashboard tags -> values of one JSONL record (numbers only)."""
    out = {}
    for key, value in record.items():
        if key in NOT_SCALARS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[key if "/" in key else f"train/{key}"] = float(value)
    return out


class TensorBoardSink:
    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))

    def log(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, mode: str, project: str, name: str, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project=project, name=name, dir=str(run_dir), mode=mode,  # type: ignore[arg-type]
                              config=config,
                              settings=wandb.Settings(console="off", silent=True))

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLog:
    """JSONL (authoritative) fanned out to the configured dashboards. A dashboard that fails is logged and dropped;
    the JSONL log never is."""

    def __init__(self, path: Path, cfg: Config) -> None:
        self.jsonl = JsonlLog(path)
        self.sinks: list[Any] = []
        d, run_dir = cfg.dashboards, cfg.run_dir
        if d.tensorboard:
            self.sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        if d.wandb != "off":
            self.sinks.append(WandbSink(run_dir, d.wandb, d.wandb_project, cfg.run.name,
                                        cfg.model_dump(mode="json", exclude={"endpoints", "security"})))

    def write(self, record: dict[str, Any]) -> None:
        self.jsonl.write(record)
        values, step = scalars(record), int(record.get("step", 0))
        for sink in list(self.sinks):
            try:
                sink.log(values, step)
            except Exception as exc:  # noqa: BLE001 - a dashboard must not stop training
                log.warning("dashboard %s failed (%s: %s); it is turned off for this run", type(sink).__name__,
                            type(exc).__name__, exc)
                self.sinks.remove(sink)

    def close(self) -> None:
        self.jsonl.close()
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001
                log.warning("dashboard %s did not close cleanly: %s", type(sink).__name__, exc)
