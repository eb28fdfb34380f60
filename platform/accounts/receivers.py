"""A changed password revokes the user's API tokens (``services.tokens_revoke_for_password_change``).

Django sends no signal of its own for a password change; the password field's stored hash changing on
save is the change, whoever made it (the password-change page, the admin, ``changepassword``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models.signals import pre_save
from django.dispatch import receiver

from accounts import services


@receiver(pre_save, sender=get_user_model())
def revoke_tokens_on_password_change(sender: Any, instance: Any, **kwargs: Any) -> None:
    if instance.pk is None or kwargs.get("raw"):
        return
    before = sender.objects.filter(pk=instance.pk).values_list("password", flat=True).first()
    if before is not None and before != instance.password:
        services.tokens_revoke_for_password_change(user_id=instance.pk)
