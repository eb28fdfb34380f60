"""Stored configs lose the fields that moved out of the engine's config into the job's placement
(:data:`MOVED_PATHS`; the engine's table of them, ``rl_engine.config.moved``, goes away in a later release,
so the migration keeps its own copy).

The platform set them all at launch whatever a row said, so nothing is lost: a run created before the
change resumes after it from the checkpoint its ``resumed_from_checkpoint`` records (what the launcher
puts in the new run's placement), in a folder of its own, its JSONL log in that folder. Rows are read
in chunks; only those that held a moved field are written.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

CONFIGS = (("experiments", "Experiment"), ("experiments", "Run"))
MOVED_PATHS = (
    ("trainer", "checkpoint_dir"),
    ("trainer", "resume_from"),
    ("pipeline", "ray_address"),
    ("logging", "jsonl_path"),
    ("logging", "progress_bar"),
    ("logging", "mlflow", "artifact_location"),
    ("logging", "wandb", "dir"),
)


def without_moved(node: Any, paths: tuple[tuple[str, ...], ...] = MOVED_PATHS) -> Any:
    """``node`` rebuilt without the fields at ``paths`` (relative to it); anything but a mapping as it is."""
    if not isinstance(node, dict):
        return node
    dropped = {path[0] for path in paths if len(path) == 1}
    return {
        key: without_moved(value, tuple(path[1:] for path in paths if len(path) > 1 and path[0] == key))
        for key, value in node.items()
        if key not in dropped
    }


def drop_moved_fields(apps, schema_editor) -> None:
    for app, name in CONFIGS:
        model = apps.get_model(app, name)
        for row in model.objects.only("pk", "config").iterator(chunk_size=2000):
            kept = without_moved(row.config)
            if kept != row.config:
                model.objects.filter(pk=row.pk).update(config=kept)


class Migration(migrations.Migration):
    dependencies = [("experiments", "0002_initial"), ("core", "0002_repair_stored_json")]

    operations = [migrations.RunPython(drop_moved_fields, migrations.RunPython.noop, elidable=True)]
