"""``python -m queueapp.upstream.simulator``: serve until SIGINT/SIGTERM (``--help``)."""

import sys

from queueapp.upstream.simulator.cli import main

sys.exit(main())
