import io

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def test_createmember_prints_a_working_token_last(api, default_tiers):
    out = io.StringIO()
    call_command("createmember", "carol", "--tier", "max", "--staff", stdout=out)
    token = out.getvalue().strip().splitlines()[-1]
    me = api.as_member(token).get("/api/me/").json()
    assert (me["name"], me["tier"], me["is_staff"]) == ("carol", "max", True)


def test_createmember_refuses_unknown_tiers_and_duplicates(default_tiers):
    with pytest.raises(CommandError, match="no tier named 'gold'; tiers: "):
        call_command("createmember", "dan", "--tier", "gold")
    call_command("createmember", "dan", "--tier", "free", stdout=io.StringIO())
    with pytest.raises(CommandError, match="exists already"):
        call_command("createmember", "dan", "--tier", "free")
