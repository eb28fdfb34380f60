from django.contrib import admin

from accounts.models import ApiToken, Invitation, Membership, Project
from accounts.services import token_revoke


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "created_by", "created_at", "allow_trust_remote_code")
    list_filter = ("allow_trust_remote_code",)
    search_fields = ("name",)
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("project", "user", "role", "created_at")
    list_filter = ("role",)
    search_fields = ("project__name", "user__username")


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    """Pending invitations (an owner who is not an administrator adds members this way)."""

    list_display = ("project", "username", "role", "invited_by", "created_at")
    list_filter = ("role",)
    search_fields = ("project__name", "username")
    raw_id_fields = ("invited_by",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Secrets are never stored; the admin can see and revoke tokens, not create ones (use the API)."""

    list_display = (
        "name",
        "kind",
        "prefix",
        "user",
        "project",
        "run",
        "created_at",
        "expires_at",
        "revoked_at",
    )
    list_filter = ("kind",)
    search_fields = ("name", "prefix", "user__username")
    # Revocation goes through the service (it revokes the tokens created with this one too).
    readonly_fields = (
        "kind", "prefix", "key_hash", "user", "project", "run", "parent", "created_at", "last_used_at",
        "revoked_at",
    )  # fmt: skip
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens (and the tokens created with them)")
    def revoke(self, request, queryset) -> None:
        for token in queryset:
            token_revoke(token=token)
