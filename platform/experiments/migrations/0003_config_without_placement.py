"""Stored configs lose the fields that moved out of the engine's config into the job's placement
(``rl_engine.moved_fields``: ``trainer.checkpoint_dir``, ``trainer.resume_from``, ``pipeline.ray_address``,
``logging.jsonl_path``, ``logging.progress_bar``, ``logging.mlflow.artifact_location``, ``logging.wandb.dir``).

The platform set them all at launch whatever a row said, so nothing is lost: a run created before the
change resumes after it from the checkpoint its ``resumed_from_checkpoint`` records (what the launcher
puts in the new run's placement), in a folder of its own, its JSONL log in that folder. Rows are read
in chunks; only those that held a moved field are written.
"""

from django.db import migrations

from rl_engine.moved_fields import split_moved

CONFIGS = (("experiments", "Experiment"), ("experiments", "Run"))


def drop_moved_fields(apps, schema_editor) -> None:
    for app, name in CONFIGS:
        model = apps.get_model(app, name)
        for row in model.objects.only("pk", "config").iterator(chunk_size=2000):
            kept, _ = split_moved(row.config)
            if kept != row.config:
                model.objects.filter(pk=row.pk).update(config=kept)


class Migration(migrations.Migration):
    dependencies = [("experiments", "0002_initial"), ("core", "0002_repair_stored_json")]

    operations = [migrations.RunPython(drop_moved_fields, migrations.RunPython.noop, elidable=True)]
