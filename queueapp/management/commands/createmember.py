from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueapp import services
from queueapp.models import Member, Tier


class Command(BaseCommand):
    help = "Create a member and print its API token (last line of output)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--tier", required=True, help="free, pro, max or another tier's name")
        parser.add_argument(
            "--staff", action="store_true", help="may read all jobs and edit policy"
        )

    def handle(self, *args: object, name: str, tier: str, staff: bool, **options: object) -> None:
        found = Tier.objects.filter(name=tier).first()
        if found is None:
            names = ", ".join(Tier.objects.values_list("name", flat=True)) or "none (load fixtures)"
            raise CommandError(f"no tier named {tier!r}; tiers: {names}")
        if Member.objects.filter(name=name).exists():
            raise CommandError(f"a member named {name!r} exists already")
        member, token = services.member_create(name=name, tier=found, is_staff=staff)
        self.stdout.write(f"created member {member.name} (tier {found.name}, staff: {staff})")
        self.stdout.write(token)
