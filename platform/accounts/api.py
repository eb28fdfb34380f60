"""Projects, memberships and API tokens. Permission policy: accounts.access."""

from __future__ import annotations

from django.contrib.auth import authenticate, get_user_model
from django.db import transaction
from django.db.models import Q
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, generics, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import services
from accounts.access import Conflict, forget_roles, project_roles, require_role, visible_projects
from accounts.models import ApiToken, Invitation, Membership, Project, Role, TokenKind
from accounts.parsers import JsonOnly
from accounts.serializers import (
    InvitationSerializer,
    MembershipCreateSerializer,
    MembershipSerializer,
    MembershipUpdateSerializer,
    MeSerializer,
    ProjectSerializer,
    TokenCreatedSerializer,
    TokenCreateSerializer,
    TokenLoginSerializer,
    TokenSerializer,
)
from accounts.throttles import LoginAddressThrottle, LoginThrottle, TokenCreateThrottle
from experiments.models import ACTIVE_STATES


class MeView(JsonOnly, APIView):
    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        roles = project_roles(request)
        return Response(
            {
                "id": request.user.pk,
                "username": request.user.get_username(),
                "projects": {str(k): v for k, v in roles.items()},
            }
        )


class ProjectListView(JsonOnly, generics.ListCreateAPIView):
    serializer_class = ProjectSerializer

    def get_queryset(self):
        return visible_projects(self.request)

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "roles": project_roles(self.request)}

    def perform_create(self, serializer: ProjectSerializer) -> None:
        if self.request.auth is not None and getattr(self.request.auth, "project_id", None):
            raise exceptions.PermissionDenied("A token limited to one project cannot create projects.")
        project = services.project_create(user=self.request.user, **serializer.validated_data)
        forget_roles(self.request)  # the creator is now an owner
        serializer.instance = project
        serializer.context["roles"] = project_roles(self.request)


class ProjectDetailView(JsonOnly, generics.RetrieveUpdateDestroyAPIView):
    serializer_class = ProjectSerializer
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return visible_projects(self.request)

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "roles": project_roles(self.request)}

    def get_object(self) -> Project:
        project = super().get_object()
        if self.request.method not in ("GET", "HEAD", "OPTIONS"):
            require_role(self.request, project.pk, Role.OWNER)
        return project

    def perform_destroy(self, instance: Project) -> None:
        # Deleting the rows of a live run would leave its Ray job running with nobody supervising it.
        if instance.runs.filter(state__in=ACTIVE_STATES).exists():
            raise Conflict("the project has active runs: cancel them first")
        instance.delete()


def _project_for(request: Request, project_id: int, minimum: str) -> Project:
    require_role(request, project_id, minimum)
    return get_object_or_404(Project, pk=project_id)


class MembershipListView(JsonOnly, APIView):
    @extend_schema(responses=MembershipSerializer(many=True))
    def get(self, request: Request, project_id: int) -> Response:
        project = _project_for(request, project_id, Role.VIEWER)
        rows = project.memberships.select_related("user")
        return Response(MembershipSerializer(rows, many=True).data)

    @extend_schema(
        request=MembershipCreateSerializer,
        responses={201: MembershipSerializer, 202: InvitationSerializer},
        description=(
            "A member already in the project: its role changes (201). Anyone else: an administrator adds "
            "the account at once (201; 400 when there is none); an owner who is not one invites the name "
            "(202, the same answer whether or not the account exists), and the account joins when it "
            "accepts (POST /api/invitations/{id}/accept)."
        ),
    )
    def post(self, request: Request, project_id: int) -> Response:
        project = _project_for(request, project_id, Role.OWNER)
        ser = MembershipCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        username, role = ser.validated_data["username"], ser.validated_data["role"]
        member = project.memberships.select_related("user").filter(user__username=username).first()
        if member is not None or request.user.is_staff:  # members are visible to the owner anyway
            user = member.user if member else _active_user(username)
            membership = _membership_set(project, user, role)
            return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)
        invitation = services.member_invite(project=project, username=username, role=role, by=request.user)
        return Response(InvitationSerializer(invitation).data, status=status.HTTP_202_ACCEPTED)


def _active_user(username: str):
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise exceptions.ValidationError({"username": ["no active user with this username"]})
    return user


class ProjectInvitationListView(JsonOnly, APIView):
    """Owners: the project's pending invitations."""

    @extend_schema(responses=InvitationSerializer(many=True))
    def get(self, request: Request, project_id: int) -> Response:
        project = _project_for(request, project_id, Role.OWNER)
        return Response(InvitationSerializer(project.invitations.select_related("project"), many=True).data)


class ProjectInvitationDetailView(JsonOnly, APIView):
    @extend_schema(responses={204: None}, description="Withdraw a pending invitation.")
    def delete(self, request: Request, project_id: int, invitation_id: int) -> Response:
        _project_for(request, project_id, Role.OWNER)
        get_object_or_404(Invitation, pk=invitation_id, project_id=project_id).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


def _my_invitations(request: Request):
    """Invitations addressed to the user's account; none through a token limited to a project (it may
    not join others)."""
    token = _request_token(request)
    if token is not None and token.project_id is not None:
        return Invitation.objects.none()
    return Invitation.objects.filter(username=request.user.get_username()).select_related("project")


class InvitationListView(JsonOnly, APIView):
    """Invitations to projects addressed to you."""

    @extend_schema(responses=InvitationSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(InvitationSerializer(_my_invitations(request), many=True).data)


class InvitationDetailView(JsonOnly, APIView):
    @extend_schema(responses={204: None}, description="Decline an invitation addressed to you.")
    def delete(self, request: Request, invitation_id: int) -> Response:
        get_object_or_404(_my_invitations(request), pk=invitation_id).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationAcceptView(JsonOnly, APIView):
    @extend_schema(request=None, responses={201: MembershipSerializer})
    def post(self, request: Request, invitation_id: int) -> Response:
        invitation = get_object_or_404(_my_invitations(request), pk=invitation_id)
        membership = services.invitation_accept(invitation=invitation, user=request.user)
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)


def _membership_set(project: Project, user, role: str) -> Membership:
    try:
        return services.membership_set(project=project, user=user, role=role)
    except services.PermissionProblem as exc:
        raise exceptions.ValidationError({"role": [str(exc)]}) from None


class MembershipDetailView(JsonOnly, APIView):
    def _get(self, request: Request, project_id: int, membership_id: int) -> Membership:
        _project_for(request, project_id, Role.OWNER)
        return get_object_or_404(
            Membership.objects.select_related("user", "project"), pk=membership_id, project_id=project_id
        )

    @extend_schema(request=MembershipUpdateSerializer, responses=MembershipSerializer)
    def patch(self, request: Request, project_id: int, membership_id: int) -> Response:
        membership = self._get(request, project_id, membership_id)
        ser = MembershipUpdateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        membership = _membership_set(membership.project, membership.user, ser.validated_data["role"])
        return Response(MembershipSerializer(membership).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, project_id: int, membership_id: int) -> Response:
        membership = self._get(request, project_id, membership_id)
        try:
            services.membership_remove(membership=membership)
        except services.PermissionProblem as exc:
            raise exceptions.ValidationError({"role": [str(exc)]}) from None
        return Response(status=status.HTTP_204_NO_CONTENT)


def _request_token(request: Request) -> ApiToken | None:
    return request.auth if isinstance(request.auth, ApiToken) else None


def _own_tokens(request: Request):
    """The user's tokens. Through a token: only that token and the tokens created with it (a narrower
    child can neither list nor revoke its parent or a sibling), and through a token limited to a
    project, only tokens limited to it."""
    qs = ApiToken.objects.filter(user=request.user, kind=TokenKind.USER)
    used = _request_token(request)
    if used is not None:
        qs = qs.filter(pk__in=services.token_family_ids(used))
        if used.project_id is not None:
            qs = qs.filter(project_id=used.project_id)
    return qs


class TokenListView(JsonOnly, APIView):
    """Your own user tokens. The secret of a new token is in the create response only."""

    throttle_classes = [TokenCreateThrottle]  # counts POSTs only

    @extend_schema(responses=TokenSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(TokenSerializer(_own_tokens(request).select_related("user"), many=True).data)

    @extend_schema(request=TokenCreateSerializer, responses={201: TokenCreatedSerializer})
    def post(self, request: Request) -> Response:
        ser = TokenCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        project = None
        if data.get("project"):
            require_role(request, data["project"], Role.VIEWER)
            project = Project.objects.get(pk=data["project"])
        if data.get("expires_at") and data["expires_at"] <= timezone.now():
            raise exceptions.ValidationError({"expires_at": ["must be in the future"]})
        try:
            issued = services.token_create(
                user=request.user,
                name=data["name"],
                project=project,
                expires_at=data.get("expires_at"),
                parent=_request_token(request),
            )
        except services.TokenRuleError as exc:
            raise exceptions.ValidationError({exc.field: [str(exc)]}) from None
        out = TokenSerializer(issued.token).data | {"secret": issued.secret}
        return Response(out, status=status.HTTP_201_CREATED)


LOGIN_REFUSED = "Wrong username or password."


class TokenLoginView(JsonOnly, APIView):
    """A user token for a username and password, without a browser session (``rlp login``). Only the
    token's secret is answered; the password is checked and never stored."""

    authentication_classes: list = []  # the credentials are the body: no session (no CSRF), no token header
    permission_classes = [AllowAny]
    throttle_classes = [LoginAddressThrottle, LoginThrottle]  # the login page's rates, and its counters

    def get_authenticate_header(self, request: Request) -> str:
        return "Token"  # a refused login is a 401, like a refused token (DRF answers 403 without a scheme)

    def _token_create_allowed(self, request: Request) -> None:
        # the user's token-creation rate, as POST /api/tokens counts it (503 while the store is away)
        throttle = TokenCreateThrottle()
        if not throttle.allow_request(request, self):
            self.throttled(request, throttle.wait())

    @extend_schema(
        request=TokenLoginSerializer,
        responses={201: TokenCreatedSerializer},
        auth=[],
        description=(
            "Creates a user token (all the user's projects) for `username` and `password`, which expires "
            "(LOGIN_TOKEN_LIFETIME_DAYS, 30 by default, or sooner when `expires_at` asks), cannot create "
            "tokens, and is revoked when the password changes: 401 with the "
            "same message for an unknown, inactive or wrong account; rate-limited like the login page "
            "(429 with Retry-After), and by the user's token-creation rate; 503 with Retry-After while "
            "the rate-limit store does not answer. No session is created."
        ),
    )
    def post(self, request: Request) -> Response:
        ser = TokenLoginSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        if data.get("expires_at") and data["expires_at"] <= timezone.now():
            raise exceptions.ValidationError({"expires_at": ["must be in the future"]})
        user = authenticate(request, username=data["username"], password=data["password"])
        if user is None:
            raise exceptions.AuthenticationFailed(LOGIN_REFUSED)
        request.user = user
        self._token_create_allowed(request)
        issued = services.login_token_create(user=user, name=data["name"], expires_at=data.get("expires_at"))
        out = TokenSerializer(issued.token).data | {"secret": issued.secret}
        return Response(out, status=status.HTTP_201_CREATED)


class TokenDetailView(JsonOnly, APIView):
    @extend_schema(responses=TokenSerializer)
    def get(self, request: Request, token_id: int) -> Response:
        return Response(TokenSerializer(get_object_or_404(_own_tokens(request), pk=token_id)).data)

    @extend_schema(responses={204: None}, description="Revoke (the row stays, marked revoked).")
    def delete(self, request: Request, token_id: int) -> Response:
        services.token_revoke(token=get_object_or_404(_own_tokens(request), pk=token_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


def _project_tokens(request: Request, project_id: int):
    """Every token that can act in the project. Through a token, the user's own tokens outside that
    token's family are left out (as in ``_own_tokens``): an owner's child token cannot revoke its parent."""
    qs = ApiToken.objects.filter(Q(project_id=project_id) | Q(run__project_id=project_id))
    used = _request_token(request)
    if used is not None:
        qs = qs.exclude(Q(user=request.user) & ~Q(pk__in=services.token_family_ids(used)))
    return qs.select_related("user")


class ProjectTokenListView(JsonOnly, APIView):
    """Owners: every token that can act in the project (tokens limited to it, run ingest tokens)."""

    @extend_schema(responses=TokenSerializer(many=True))
    def get(self, request: Request, project_id: int) -> Response:
        _project_for(request, project_id, Role.OWNER)
        return Response(TokenSerializer(_project_tokens(request, project_id), many=True).data)


class ProjectTokenDetailView(JsonOnly, APIView):
    @extend_schema(responses={204: None}, description="Revoke a token scoped to the project.")
    def delete(self, request: Request, project_id: int, token_id: int) -> Response:
        _project_for(request, project_id, Role.OWNER)
        with transaction.atomic():
            services.token_revoke(token=get_object_or_404(_project_tokens(request, project_id), pk=token_id))
        return Response(status=status.HTTP_204_NO_CONTENT)
