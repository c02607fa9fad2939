"""The demo member's token, kept in a file so that it outlives a restart.

Only a token's hash is stored, so the database cannot give a token back:
the file (GPUSCHED_DEMO_TOKEN_FILE, readable by its owner only) keeps the
one `make run` printed, and each start checks it against the member's hash.
A file whose token no longer matches (the member deleted, the database
reset) is replaced by a new token.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from django.conf import settings

from queueapp import services
from queueapp.models import Member, Tier, hash_token

DEMO_MEMBER = "demo"
DEMO_TIER = "pro"


def demo_token_kept() -> str:
    """The demo member's token: the file's while it matches, else a new one
    (the member created if need be), written to the file."""
    path = Path(settings.GPUSCHED_DEMO_TOKEN_FILE)
    saved = _read(path)
    member = Member.objects.filter(name=DEMO_MEMBER).first()
    if member is not None and saved and hmac.compare_digest(member.token_hash, hash_token(saved)):
        path.chmod(0o600)  # should someone have widened it
        return saved
    if member is None:
        _, token = services.member_create(
            name=DEMO_MEMBER, tier=Tier.objects.get(name=DEMO_TIER), is_staff=True
        )
    else:
        token = services.member_token_rotate(member=member)
    demo_token_write(token)
    return token


def demo_token_write(token: str) -> Path:
    """Replace the file's token with `token`, in one rename, mode 0600 from
    the start: no moment where another user could read it."""
    path = Path(settings.GPUSCHED_DEMO_TOKEN_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = path.with_name(f"{path.name}.new")
    descriptor = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)  # a leftover file keeps its mode otherwise
        file.write(f"{token}\n")
    os.replace(new, path)
    return path


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""  # none yet, or unreadable: a new token replaces it
