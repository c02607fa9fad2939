"""Who makes a front-door call: its bearer key, checked by `member_login`
(queueapp/logins.py, which also limits failed logins per address), and the
refusals in OpenAI's shape (401 for a missing or wrong key, 429 past the
failed-login limit).

A call with no key offered is not a guess and is not counted. Admission
checks the key in the same trip to the database threads that queues the
job (queueapp/frontdoor/admission.py); `/v1/models`, which queues nothing,
checks it alone (`authenticate`).
"""

from __future__ import annotations

from queueapp.frontdoor.answers import Answer
from queueapp.frontdoor.gateway import db
from queueapp.frontdoor.incoming_call import Call
from queueapp.logins import TooManyFailedLogins, member_login
from queueapp.models import Member


def member_for(authorization: str, client: str) -> Member | None:
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None  # no key offered: not a guess to count
    return member_login(token=token, client=client)


def login_refused(exc: TooManyFailedLogins) -> Answer:
    return Answer.error(
        429,
        exc.message,
        "rate_limit_error",
        "too_many_failed_logins",
        Retry_After=str(exc.retry_after),
    )


def unauthorized() -> Answer:
    return Answer.error(
        401, "missing or invalid API key", "invalid_request_error", "invalid_api_key"
    )


async def authenticate(call: Call) -> Member | Answer:
    """The caller, or the OpenAI-shaped refusal to answer with (401 or 429)."""
    try:
        member = await db(member_for)(call.headers.get("authorization", ""), call.client)
    except TooManyFailedLogins as exc:
        return login_refused(exc)
    return member if member is not None else unauthorized()
