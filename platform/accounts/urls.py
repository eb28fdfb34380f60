from django.urls import path

from accounts import api

urlpatterns = [
    path("me", api.MeView.as_view(), name="api-me"),
    path("projects", api.ProjectListView.as_view(), name="api-projects"),
    path("projects/<int:pk>", api.ProjectDetailView.as_view(), name="api-project"),
    path("projects/<int:project_id>/members", api.MembershipListView.as_view(), name="api-members"),
    path(
        "projects/<int:project_id>/members/<int:membership_id>",
        api.MembershipDetailView.as_view(),
        name="api-member",
    ),
    path("projects/<int:project_id>/tokens", api.ProjectTokenListView.as_view(), name="api-project-tokens"),
    path(
        "projects/<int:project_id>/tokens/<int:token_id>",
        api.ProjectTokenDetailView.as_view(),
        name="api-project-token",
    ),
    path(
        "projects/<int:project_id>/invitations",
        api.ProjectInvitationListView.as_view(),
        name="api-project-invitations",
    ),
    path(
        "projects/<int:project_id>/invitations/<int:invitation_id>",
        api.ProjectInvitationDetailView.as_view(),
        name="api-project-invitation",
    ),
    path("invitations", api.InvitationListView.as_view(), name="api-invitations"),
    path("invitations/<int:invitation_id>", api.InvitationDetailView.as_view(), name="api-invitation"),
    path(
        "invitations/<int:invitation_id>/accept",
        api.InvitationAcceptView.as_view(),
        name="api-invitation-accept",
    ),
    path("tokens", api.TokenListView.as_view(), name="api-tokens"),
    path("tokens/login", api.TokenLoginView.as_view(), name="api-token-login"),
    path("tokens/<int:token_id>", api.TokenDetailView.as_view(), name="api-token"),
]
