"""`gpusched-admin`: Django's management commands for an installed gpusched.

`manage.py` lives in the source tree only; a service installed from the
wheel runs `gpusched-admin migrate`, `gpusched-admin dispatcher --gpu gpu0`
and the rest, with the settings chosen for it.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":  # `python -m gpusched.manage`: how a dispatcher becomes its cluster
    main()
