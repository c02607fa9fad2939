from django.urls import path

from queueapp.api import inventory, version, views

urlpatterns = [
    path("jobs/", views.JobListCreateView.as_view(), name="api-jobs"),
    path("jobs/<int:job_id>/", views.JobDetailView.as_view(), name="api-job"),
    path("jobs/<int:job_id>/result/", views.JobResultView.as_view(), name="api-job-result"),
    path("jobs/<int:job_id>/why/", views.JobWhyView.as_view(), name="api-job-why"),
    path(
        "jobs/<int:job_id>/webhook/redeliver/",
        views.WebhookRedeliverView.as_view(),
        name="api-job-webhook-redeliver",
    ),
    path("preload/", views.PreloadView.as_view(), name="api-preload"),
    path("stats/", views.StatsView.as_view(), name="api-stats"),
    path("queue/", views.QueueView.as_view(), name="api-queue"),
    path("chains/", views.ChainListView.as_view(), name="api-chains"),
    path("chains/<str:chain_id>/", views.ChainDetailView.as_view(), name="api-chain"),
    path("me/", views.MeView.as_view(), name="api-me"),
    path("policy/", views.PolicyView.as_view(), name="api-policy"),
    path("health/", views.HealthView.as_view(), name="api-health"),
    path("version/", version.VersionView.as_view(), name="api-version"),
    path("gpus/", inventory.GpuListView.as_view(), name="api-gpus"),
    path("gpus/<str:name>/", inventory.GpuDetailView.as_view(), name="api-gpu"),
    path("models/", inventory.ModelListView.as_view(), name="api-models"),
    path("models/<path:name>/", inventory.ModelDetailView.as_view(), name="api-model"),
]
