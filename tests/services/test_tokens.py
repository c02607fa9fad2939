"""The demo member's token outlives a restart (its file under var/), and
`manage.py rotatetoken` replaces a member's token: real PostgreSQL, the API
over Django's test client."""

from __future__ import annotations

import io
import stat

import pytest
from django.core.management import CommandError, call_command

from queueapp.management.demo_token import DEMO_MEMBER, demo_token_kept
from queueapp.models import Member
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def token_file(settings, tmp_path, default_tiers):
    settings.GPUSCHED_DEMO_TOKEN_FILE = tmp_path / "var" / "demo-token"
    return settings.GPUSCHED_DEMO_TOKEN_FILE


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def answers(api, token: str) -> int:
    return api.as_member(token).get("/api/jobs/").status_code


def rotate(name: str) -> list[str]:
    out = io.StringIO()
    call_command("rotatetoken", name, stdout=out)
    return out.getvalue().splitlines()


def test_the_demo_token_is_kept_across_starts_in_a_file_only_its_owner_reads(token_file, api):
    token = demo_token_kept()
    assert token_file.read_text().strip() == token
    assert mode(token_file) == 0o600
    token_file.chmod(0o644)  # widened by hand
    assert demo_token_kept() == token  # the next start
    assert mode(token_file) == 0o600
    assert answers(api, token) == 200


@pytest.mark.parametrize("how", ["member deleted", "token rotated elsewhere", "file garbled"])
def test_a_token_file_that_no_longer_matches_is_replaced(token_file, api, how):
    old = demo_token_kept()
    if how == "member deleted":  # or the database reset by `make clean-db`
        Member.objects.filter(name=DEMO_MEMBER).delete()
    elif how == "token rotated elsewhere":
        Member.objects.filter(name=DEMO_MEMBER).update(token_hash="0" * 64)
    else:
        token_file.write_text("not a token\n")
    new = demo_token_kept()
    assert new != old
    assert token_file.read_text().strip() == new
    assert mode(token_file) == 0o600
    assert answers(api, new) == 200
    assert answers(api, old) == 401


def test_rotatetoken_revokes_the_old_token_and_prints_the_new_one_last(token_file, api):
    member, old = factories.member("ann", "pro")
    lines = rotate("ann")
    new = lines[-1]
    assert "new token for ann" in lines[0] and "old token no longer works" in lines[0]
    assert new != old
    assert answers(api, old) == 401
    assert answers(api, new) == 200
    assert not token_file.exists()  # not the demo member: its file is left alone


def test_rotatetoken_of_the_demo_member_rewrites_its_file(token_file, api):
    old = demo_token_kept()
    lines = rotate(DEMO_MEMBER)
    new = lines[-1]
    assert str(token_file) in lines[1]
    assert token_file.read_text().strip() == new
    assert mode(token_file) == 0o600
    assert demo_token_kept() == new  # the next `make run` prints it
    assert answers(api, old) == 401
    assert answers(api, new) == 200


def test_rotatetoken_of_an_unknown_member_says_so_and_names_the_members(default_tiers):
    factories.member("ann", "pro")
    factories.member("bob", "free")
    with pytest.raises(CommandError, match=r"no member named 'carol'; members: ann, bob$"):
        rotate("carol")
