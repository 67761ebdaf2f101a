"""The run folder on disk: atomic, durable writes (atomic.py), the sample ids each checkpoint committed
(committed_ids.py)
and the trainer's lineage of epochs (lineage.py). Read by services and by the launcher alike."""
