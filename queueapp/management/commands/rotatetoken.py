from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueapp import services
from queueapp.management.demo_token import DEMO_MEMBER, demo_token_write
from queueapp.models import Member

# Members named in the error for an unknown one, at most.
NAMES_SHOWN = 20


class Command(BaseCommand):
    help = (
        "Issue a new API token for a member and revoke the old one at once; the new "
        "token is the last line of output."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("member", help="the member's name")

    def handle(self, *args: object, member: str, **options: object) -> None:
        found = Member.objects.filter(name=member).first()
        if found is None:
            names = list(
                Member.objects.order_by("name").values_list("name", flat=True)[: NAMES_SHOWN + 1]
            )
            shown = ", ".join(names[:NAMES_SHOWN]) + (", ..." if len(names) > NAMES_SHOWN else "")
            raise CommandError(f"no member named {member!r}; members: {shown or 'none'}")
        token = services.member_token_rotate(member=found)
        self.stdout.write(f"issued a new token for {found.name}; the old token no longer works")
        if found.name == DEMO_MEMBER:
            path = demo_token_write(token)
            self.stdout.write(f"wrote it to {path}; the next `make run` prints it")
        self.stdout.write(token)
