from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from queueapp import pages

urlpatterns = [
    path("", pages.home, name="home"),
    path("jobs/<int:job_id>/why/", pages.job_why_page, name="job-why-page"),
    path("login/", pages.login_page, name="login"),
    path("logout/", pages.logout_page, name="logout"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/", include("queueapp.api.urls")),
    path("metrics", include("queueapp.metrics")),
    # The OpenAI-compatible front door, on llama-swap's own paths, is served
    # in front of Django: gpusched/asgi.py.
]

# JSON (or OpenAI-shaped) errors on API paths; Django's pages elsewhere.
handler400 = "queueapp.error_pages.bad_request"
handler403 = "queueapp.error_pages.permission_denied"
handler404 = "queueapp.error_pages.not_found"
handler500 = "queueapp.error_pages.server_error"
