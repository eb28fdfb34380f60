"""Repair free-form JSON stored before every body passed ``rl_engine.safe_json``: lone surrogates become
U+FFFD, NUL is removed, NaN and Infinity become null, so that every run's events and every experiment
list again (docs/api.md, "Trust boundary").

PostgreSQL's ``jsonb`` refused all of them on insert (the request failed with a 500 and stored
nothing); the embedded SQLite database stored lone surrogates (escaped), so there the tables are read
in chunks.
"""

from django.db import migrations

from rl_engine.safe_json import json_problem, json_repaired

# (app, model, JSON fields) of every column that stores JSON a client sent.
STORED_JSON = (
    ("tracking", "RunEvent", ("data",)),
    ("experiments", "Experiment", ("config", "tags")),
    ("experiments", "Run", ("config",)),
)
UNBOUNDED = 10**6  # depth is not what is repaired here


def repair_stored_json(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        return  # jsonb cannot hold any of the values repaired here
    for app, name, fields in STORED_JSON:
        model = apps.get_model(app, name)
        for row in model.objects.only("pk", *fields).iterator(chunk_size=2000):
            bad = [f for f in fields if json_problem(getattr(row, f), max_depth=UNBOUNDED)]
            if bad:
                model.objects.filter(pk=row.pk).update(**{f: json_repaired(getattr(row, f)) for f in bad})


class Migration(migrations.Migration):
    dependencies = [
        ("core", "0001_initial"),
        ("experiments", "0002_initial"),
        ("tracking", "0005_progress_and_batch_ids"),
    ]

    operations = [migrations.RunPython(repair_stored_json, migrations.RunPython.noop, elidable=True)]
