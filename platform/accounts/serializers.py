"""Input/output shapes of the accounts API."""

from __future__ import annotations

from rest_framework import serializers

from accounts.models import ApiToken, Invitation, Membership, Project, Role


class ProjectSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField(help_text="Your role in the project.")
    allow_trust_remote_code = serializers.BooleanField(
        read_only=True,
        help_text="Configs may set model.trust_remote_code (set by an administrator, in the admin).",
    )

    class Meta:
        model = Project
        fields = ["id", "name", "description", "created_at", "role", "allow_trust_remote_code"]
        read_only_fields = ["id", "created_at", "role", "allow_trust_remote_code"]

    def get_role(self, obj: Project) -> str | None:
        roles = self.context.get("roles") or {}
        return roles.get(obj.pk)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "user", "username", "role", "created_at"]
        read_only_fields = ["id", "user", "username", "created_at"]


class MembershipCreateSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class InvitationSerializer(serializers.ModelSerializer):
    project_name = serializers.CharField(source="project.name", read_only=True)

    class Meta:
        model = Invitation
        fields = ["id", "project", "project_name", "username", "role", "created_at"]
        read_only_fields = fields


class MembershipUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class TokenSerializer(serializers.ModelSerializer):
    kind = serializers.CharField(
        read_only=True, help_text="user: acts as its user; ingest: reports into one run."
    )
    is_active = serializers.BooleanField(read_only=True)
    username = serializers.CharField(source="user.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "kind",
            "name",
            "prefix",
            "username",
            "project",
            "run",
            "parent",
            "created_at",
            "expires_at",
            "revoked_at",
            "last_used_at",
            "is_active",
            "can_create_tokens",
        ]
        read_only_fields = fields


class TokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    project = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        help_text="Limit the token to this project (you must be a member).",
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


class TokenLoginSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150, trim_whitespace=False)
    password = serializers.CharField(
        max_length=4096, trim_whitespace=False, write_only=True, style={"input_type": "password"}
    )  # bounded: every attempt hashes it
    name = serializers.CharField(max_length=100, default="rlp login", help_text="The new token's name.")
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


class TokenCreatedSerializer(TokenSerializer):
    secret = serializers.CharField(read_only=True, help_text="Shown once; only its hash is stored.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    projects = serializers.DictField(child=serializers.CharField(), help_text="project id -> your role")
