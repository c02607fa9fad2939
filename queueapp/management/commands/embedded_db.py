from django.core.management.base import BaseCommand, CommandParser

from gpusched import embedded_db


class Command(BaseCommand):
    help = "Show or stop the embedded PostgreSQL under ./var/ (used when DATABASE_URL is unset)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["url", "stop"])

    def handle(self, *args: object, action: str, **options: object) -> None:
        if action == "url":
            self.stdout.write(embedded_db.ensure_running())
        else:
            embedded_db.stop()
            self.stdout.write("embedded PostgreSQL stopped")
