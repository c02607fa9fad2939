"""Token login for pages; the why page keeps other members' jobs out of reach."""

import pytest

from tests import factories

pytestmark = pytest.mark.django_db


def test_token_login_then_the_why_page_of_an_own_job(client, default_tiers):
    owner, token = factories.member("ann", "free")
    job = factories.job(owner)
    assert client.get(f"/jobs/{job.pk}/why/").status_code == 302
    refused = client.post("/login/", {"token": "gps_wrong", "next": "/"})
    assert refused.status_code == 401 and "matches no member" in refused.content.decode()
    response = client.post("/login/", {"token": token, "next": f"/jobs/{job.pk}/why/"})
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/why/"
    page = client.get(f"/jobs/{job.pk}/why/")
    assert page.status_code == 200
    assert 'id="timeline"' in page.content.decode()
    assert "Waiting for" in page.content.decode()


def test_another_members_job_page_is_404(client, default_tiers):
    owner, _ = factories.member("ann", "free")
    _, other_token = factories.member("bob", "free")
    job = factories.job(owner)
    client.post("/login/", {"token": other_token})
    assert client.get(f"/jobs/{job.pk}/why/").status_code == 404


def test_login_only_redirects_locally(client, default_tiers):
    _, token = factories.member("ann", "free")
    response = client.post("/login/", {"token": token, "next": "https://evil.example/"})
    assert response["Location"] == "/"


def test_the_home_page_says_what_gpusched_is_and_offers_the_log_in(client, default_tiers):
    page = client.get("/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "decides, fairly and explainably, which job gets a GPU next" in text
    assert 'href="/login/"' in text and "Log in" in text
    # Nothing on it contradicts the product (resident sets, parallel slots).
    assert "one job at a time" not in text.lower()


def test_the_public_dashboard_setting_still_shows_the_dashboard(client, default_tiers):
    factories.policy(public_dashboard=True)
    text = client.get("/").content.decode()
    assert "decides, fairly and explainably" not in text
    assert 'id="gpus"' in text
