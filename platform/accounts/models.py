"""Projects, memberships with roles, and API tokens (stored hashed).

Users are Django's own ``auth.User``. Everything a user can see hangs off a :class:`Project` they are a
member of; the role decides what they may change (viewer < member < owner).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    MEMBER = "member", "Member"
    OWNER = "owner", "Owner"


# Higher rank includes every right of the lower ones.
ROLE_RANK: dict[str, int] = {Role.VIEWER: 1, Role.MEMBER: 2, Role.OWNER: 3}


class Project(models.Model):
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="projects")
    # Set by an administrator only (the admin); the API shows it but never changes it.
    allow_trust_remote_code = models.BooleanField(
        "allow trust_remote_code",
        default=False,
        help_text="Configs of this project may set model.trust_remote_code (run Python code shipped with "
        "a model) on the cluster.",
    )

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project_id", "id"]
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="uniq_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class Invitation(models.Model):
    """An owner's offer of a role in ``project`` to the account named ``username``. An owner who is not
    an administrator adds members this way: the membership exists once that account accepts, so the
    answer never tells the owner whether an account of that name exists."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    username = models.CharField(max_length=150)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["project", "username"], name="uniq_invitation")]

    def __str__(self) -> str:
        return f"{self.username} to {self.project} ({self.role})"


class TokenKind(models.TextChoices):
    USER = "user", "User token"  # acts as its user (optionally limited to one project)
    INGEST = "ingest", "Run ingest token"  # may only report metrics/events/samples of one run


class ApiToken(models.Model):
    """A secret for scripts and for the engine. Only its sha256 is stored; the secret is shown once.

    A *user* token acts with its user's roles (restricted to ``project`` when set). An *ingest* token
    belongs to no user: it authenticates as anonymous and only the ingestion endpoints of ``run`` accept it.
    """

    kind = models.CharField(max_length=16, choices=TokenKind.choices, default=TokenKind.USER)
    name = models.CharField(max_length=100)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens"
    )
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="api_tokens"
    )
    run = models.ForeignKey(
        "experiments.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="ingest_tokens"
    )
    # The token whose request created this one (None: created in a browser session or the admin). A
    # child is never broader nor longer-lived than its parent, and revoking a parent revokes it.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    prefix = models.CharField(max_length=16, help_text="First characters of the secret, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # False for a token a password login issued (``rlp login``): it acts for its user but creates no
    # tokens; its children (none) could not be broader. Tokens made in a browser session may.
    can_create_tokens = models.BooleanField(default=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                name="token_kind_fields",
                condition=(
                    models.Q(kind="user", user__isnull=False, run__isnull=True)
                    | models.Q(kind="ingest", run__isnull=False, user__isnull=True)
                ),
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()
