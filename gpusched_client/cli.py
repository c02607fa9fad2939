"""`gpusched`: submit, watch, cancel, why, queue, and chains one unit at a time.

On a terminal, `watch` and `chain run` draw a live line or progress bar; when
stdout is not a terminal they print one plain line per change instead.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from gpusched_client.chain import run_chain
from gpusched_client.client import FINAL, Client, GpuschedError
from gpusched_client.text import duration

console = Console()


def _since(iso: str | None) -> float:
    return time.time() - datetime.fromisoformat(iso).timestamp() if iso else 0.0


def job_line(job: dict[str, Any]) -> str:
    """One line that says where a job stands."""
    head = f"job {job['id']} · {job['model']} · band {job['priority']:+d}"
    if job["status"] == "running":
        return head + f" · running {duration(_since(job['started_at']))}"
    head += f" · {job['status']}"
    if job["status"] == "queued":
        estimate = job.get("estimate") or {}
        if estimate.get("position"):
            head += f" · position {estimate['position']}"
            head += f" · starts in ~{duration(estimate['seconds_until_start'])} (estimate)"
        return head + f" · waiting {duration(_since(job['submitted_at']))}"
    started, finished = job.get("started_at"), job.get("finished_at")
    if started and finished:
        took = datetime.fromisoformat(finished) - datetime.fromisoformat(started)
        head += f" in {duration(took.total_seconds())}"
    return head + (f" · {job['error']}" if job.get("error") else "")


class Connection(NamedTuple):
    """Where and as whom: the group's options, kept until a command runs."""

    url: str
    token: str | None


def client_of(context: click.Context) -> Client:
    """An API client for the invocation's --url and --token.

    The token is checked here, when a command runs, rather than by click
    (`required=True` on the group's option): the group's options are checked
    before the subcommand sees its arguments, so `gpusched submit --help`
    would be refused too.
    """
    root = context.find_root()
    connection: Connection = root.obj
    if not connection.token:
        raise click.UsageError(
            "Missing option '--token': pass the API token with --token or set GPUSCHED_TOKEN.",
            ctx=root,
        )
    return Client(connection.url, connection.token)


def pass_client(command: Callable[..., Any]) -> Callable[..., Any]:
    """As click.pass_obj, with the invocation's Client as the first argument."""

    @functools.wraps(command)
    def with_client(*args: Any, **kwargs: Any) -> Any:
        return command(client_of(click.get_current_context()), *args, **kwargs)

    return with_client


@click.group()
@click.option("--url", envvar="GPUSCHED_URL", default="http://127.0.0.1:8000", show_default=True)
@click.option("--token", envvar="GPUSCHED_TOKEN", help="or GPUSCHED_TOKEN; needed by every command")
@click.pass_context
def main(context: click.Context, url: str, token: str | None) -> None:
    """gpusched from the command line."""
    context.obj = Connection(url, token)


@main.command()
@click.argument("path")
@click.option(
    "--body", "body_file", type=click.File("r"), default="-", help="JSON file; - for stdin"
)
@click.option("--priority", help="interactive, normal, batch, background or a number")
@click.option(
    "--max-wait",
    type=float,
    help="seconds the job may wait to start; refused at once if it cannot, expired if it waits",
)
@click.option("--json", "as_json", is_flag=True, help="print the job as JSON")
@pass_client
def submit(
    client: Client,
    path: str,
    body_file: Any,
    priority: str | None,
    max_wait: float | None,
    as_json: bool,
) -> None:
    """Queue a job: the JSON body llama-swap gets, posted to PATH."""
    job = client.submit(path=path, body=json.load(body_file), priority=priority, max_wait=max_wait)
    click.echo(json.dumps(job) if as_json else job_line(job))


@main.command()
@click.argument("model")
@click.option("--gpu", help="the GPU to load it on (a name from GET /api/gpus/)")
@click.option("--priority", help="interactive, normal, batch or a number; default -100")
@click.option("--wait", "wait_loaded", is_flag=True, help="wait until it is loaded")
@click.option("--json", "as_json", is_flag=True, help="print the job as JSON")
@pass_client
def preload(
    client: Client,
    model: str,
    gpu: str | None,
    priority: str | None,
    wait_loaded: bool,
    as_json: bool,
) -> None:
    """Load MODEL ahead of use, at background priority: a job that only loads it."""
    job = client.preload(model, gpu=gpu, priority=priority)
    if wait_loaded:
        job = client.wait(job["id"])
    click.echo(json.dumps(job) if as_json else job_line(job))
    sys.exit(0 if not wait_loaded or job["status"] == "succeeded" else 1)


@main.command()
@click.argument("job_id", type=int)
@pass_client
def watch(client: Client, job_id: int) -> None:
    """Follow a job until it ends: position, estimated start, running time, result."""
    if not sys.stdout.isatty():
        job = client.wait(job_id, on_change=lambda job: click.echo(job_line(job)))
    else:
        with Live(job_line(client.get(job_id)), console=console, refresh_per_second=4) as live:
            job = client.get(job_id)
            while job["status"] not in FINAL:
                live.update(job_line(job))
                time.sleep(0.5)
                job = client.get(job_id)
            live.update(job_line(job))
    sys.exit(0 if job["status"] == "succeeded" else 1)


@main.command()
@click.argument("job_id", type=int)
@pass_client
def cancel(client: Client, job_id: int) -> None:
    """Cancel a queued job (a started job is never interrupted)."""
    click.echo(job_line(client.cancel(job_id)))


@main.command()
@click.argument("job_id", type=int)
@pass_client
def why(client: Client, job_id: int) -> None:
    """Why a job waited: the summary and its parts."""
    answer = client.why(job_id)
    console.print(answer["summary"])
    table = Table("part", "seconds", "job ahead", "decided by")
    for part in answer["parts"]:
        ahead = part.get("job") or {}
        table.add_row(
            part["kind"].replace("_", " "),
            f"{part['seconds'] + part.get('swap_seconds', 0):.1f}",
            f"#{ahead['id']} {ahead['model']} band {ahead['band']:+d}" if ahead else "",
            part.get("reason", ""),
        )
    console.print(table)


@main.command()
@pass_client
def queue(client: Client) -> None:
    """The running job and the queue in dispatch order."""
    state = client.queue()
    running = state.get("running")
    console.print(
        f"running: #{running['id']} {running['model']} band {running['priority']:+d}"
        if running
        else "running: nothing"
    )
    table = Table("#", "job", "model", "band", "score", "member", "starts (estimate)")
    for entry in state["queued"]:
        table.add_row(
            str(entry["position"]),
            f"#{entry['id']}",
            entry["model"],
            f"{entry['priority']:+d}",
            f"{entry['score']['effective']:.2f}",
            entry["member"] or "another member",
            entry["estimated_start_at"][11:19],
        )
    console.print(table)
    console.print(f"{state['queued_total']} queued")


@main.group()
def chain() -> None:
    """Long work, one unit at a time."""


@chain.command("run")
@click.argument("units_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--path", "job_path", default="/v1/images/generations", show_default=True)
@click.option("--priority", default="batch", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True)
@click.option("--chain-id", help="defaults to the units file's name")
@click.option("--retries", default=2, show_default=True, help="per unit, then stop")
@click.pass_context
def chain_run(context: click.Context, **options: Any) -> None:
    """Submit UNITS_FILE's lines (one JSON body each) one at a time, saving each
    result to --out; run it again to resume where it stopped."""
    sys.exit(run_chain(client_of(context), console=console, **options))


def entry_point() -> None:
    try:
        main()
    except GpuschedError as exc:
        wait = f" (try again in {duration(exc.retry_after)})" if exc.retry_after else ""
        click.echo(f"error: {exc.message}{wait}", err=True)
        sys.exit(2)
