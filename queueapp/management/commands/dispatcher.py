"""`manage.py dispatcher --gpu NAME [--url URL] [--config PATH]`: one GPU's dispatcher.

Run it on the machine next to that GPU's llama-swap, against the shared
DATABASE_URL: it registers the GPU (its name and URL) and becomes that
GPU's django-q2 cluster (`manage.py qcluster` with GPUSCHED_GPU set), which
claims from the one queue every job this GPU can run. Ctrl-C stops it after
the job in flight. The URL is also the one the web servers use for the
front door's calls on this GPU, so it must be reachable from them too.
`--config` names its llama-swap's config file (LLAMA_SWAP_CONFIG's entry
otherwise), read for its routing: queueapp/dispatch/routing_file.py.
"""

from __future__ import annotations

import os
import sys

from django.conf import settings
from django.core.management import CommandError
from django.core.management.base import BaseCommand, CommandParser

from gpusched.upstreams import (
    API_KEY_FILE_VARIABLE,
    API_KEY_VARIABLE,
    CONFIG_VARIABLE,
    ConfigPathsInvalid,
    UpstreamListInvalid,
    parse_config_paths,
    parse_upstreams,
)
from queueapp import services


class Command(BaseCommand):
    help = "Run one GPU's dispatcher (a django-q2 cluster of its own) against the shared queue."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--gpu",
            default=os.environ.get("GPUSCHED_GPU", ""),
            help="the GPU's name in LLAMA_SWAP_URL (or, with --url, its new name)",
        )
        parser.add_argument(
            "--url", default="", help="its llama-swap URL (default: LLAMA_SWAP_URL's entry)"
        )
        parser.add_argument(
            "--config",
            default="",
            help="its llama-swap's config file, read for the routing "
            "(default: LLAMA_SWAP_CONFIG's entry)",
        )

    def handle(self, *args: object, gpu: str, url: str, config: str, **options: object) -> None:
        listed = os.environ.get("LLAMA_SWAP_URL", "")
        try:
            if url:
                name = gpu or "gpu0"
                upstreams = parse_upstreams(f"{name}={url}")
            else:
                upstreams = parse_upstreams(listed) if listed else []
        except UpstreamListInvalid as exc:
            raise CommandError(str(exc)) from None
        chosen = [u for u in upstreams if u.name == gpu] if gpu else upstreams[:1]
        if not chosen:
            names = ", ".join(u.name for u in upstreams) or "none: LLAMA_SWAP_URL is unset"
            raise CommandError(
                f"--gpu {gpu!r} is not in LLAMA_SWAP_URL (it names {names}); "
                "give its llama-swap with --url"
            )
        upstream = chosen[0]
        path = config.strip() or settings.LLAMA_SWAP_CONFIGS.path_for(upstream.name)
        config_entry = f"{upstream.name}={path}" if path else ""
        try:
            parse_config_paths(config_entry, gpu_names=[upstream.name])
        except ConfigPathsInvalid as exc:
            raise CommandError(f"--config: {exc}") from None
        services.gpu_register(name=upstream.name, url=upstream.url)
        self.stdout.write(f"dispatcher for {upstream.name} ({upstream.url})")
        sys.stdout.flush()
        env = dict(
            os.environ, GPUSCHED_GPU=upstream.name, LLAMA_SWAP_URL=f"{upstream.name}={upstream.url}"
        )
        # Its key only: the cluster's LLAMA_SWAP_URL names this GPU alone, so
        # another GPU's `NAME=KEY` would be a name it does not know.
        env.pop(API_KEY_FILE_VARIABLE, None)
        env.pop(API_KEY_VARIABLE, None)
        key = settings.LLAMA_SWAP_API_KEYS.key_for(upstream.name)
        if key:
            env[API_KEY_VARIABLE] = f"{upstream.name}={key}"
        # Its config file only, for the same reason.
        env.pop(CONFIG_VARIABLE, None)
        if config_entry:
            env[CONFIG_VARIABLE] = config_entry
        env.pop("Q_CLUSTER_NAME", None)  # the cluster is the GPU's (gpusched/settings.py)
        # gpusched.manage rather than manage.py: an installed wheel has no manage.py.
        os.execve(sys.executable, [sys.executable, "-m", "gpusched.manage", "qcluster"], env)
