from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from queueapp.logins import TooManyFailedLogins, client_address, member_login
from queueapp.models import Member


def signed_in_member(request: Request) -> Member:
    """The member whose token signed `request`: what `request.user` is in every
    view that requires authentication (DRF types it as a Django user)."""
    member = request.user
    if not isinstance(member, Member):
        raise exceptions.NotAuthenticated()
    return member


class MemberTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <token>`, the header the OpenAI SDKs send too."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Member, str] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'")
        try:
            member = member_login(token=token, client=client_address(request.META))
        except TooManyFailedLogins as exc:
            raise exceptions.Throttled(wait=exc.retry_after, detail=exc.message) from exc
        if member is None:
            raise exceptions.AuthenticationFailed("invalid token")
        return member, token

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (with WWW-Authenticate) rather than 403.
        return self.keyword


class MemberTokenScheme(OpenApiAuthenticationExtension):
    target_class = MemberTokenAuthentication
    name = "memberToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}
