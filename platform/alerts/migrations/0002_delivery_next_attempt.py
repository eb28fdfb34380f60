"""Deliveries know when their next attempt is due (the beat sweep re-sends those whose countdown task
was lost); deliveries waiting already are due from their last change."""

from django.db import migrations, models
from django.db.models import F


def due_from_last_change(apps, schema_editor):
    WebhookDelivery = apps.get_model("alerts", "WebhookDelivery")
    WebhookDelivery.objects.filter(status__in=["pending", "retrying"], next_attempt_at=None).update(
        next_attempt_at=F("updated")
    )


class Migration(migrations.Migration):
    dependencies = [
        ("alerts", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookdelivery",
            name="next_attempt_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="webhookdelivery",
            index=models.Index(fields=["status", "next_attempt_at"], name="delivery_due"),
        ),
        migrations.RunPython(due_from_last_change, migrations.RunPython.noop),
    ]
