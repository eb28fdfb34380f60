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
    path("tokens", api.TokenListView.as_view(), name="api-tokens"),
    path("tokens/<int:token_id>", api.TokenDetailView.as_view(), name="api-token"),
]
