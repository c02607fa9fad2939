"""`gpusched`: submit, watch, cancel, why, queue, gpus, models, and chains one
unit at a time.

On a terminal, `watch` and `chain run` draw a live line or progress bar; when
stdout is not a terminal they print one plain line per change instead.
"""

from __future__ import annotations

import contextlib
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

from gpusched_client.bodies import CHAT, body_for, path_for_model
from gpusched_client.chain import run_chain
from gpusched_client.client import FINAL, Client, GpuschedError
from gpusched_client.text import duration, resident_set

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
            kind = "a guess" if estimate.get("basis") == "guess" else "estimate"
            head += f" · starts in ~{duration(estimate['seconds_until_start'])} ({kind})"
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
@click.version_option(package_name="gpusched", prog_name="gpusched")
@click.option("--url", envvar="GPUSCHED_URL", default="http://127.0.0.1:8000", show_default=True)
@click.option("--token", envvar="GPUSCHED_TOKEN", help="or GPUSCHED_TOKEN; needed by every command")
@click.pass_context
def main(context: click.Context, url: str, token: str | None) -> None:
    """gpusched from the command line."""
    context.obj = Connection(url, token)


@main.command()
@click.argument("path_argument", metavar="[PATH]", required=False)
@click.option("--model", help="build the body for MODEL (with --prompt), or set it in --body's")
@click.option("--prompt", help="the text: a chat message, an image's prompt, speech's input")
@click.option(
    "--path",
    "path_option",
    help="llama-swap's path (the same as PATH); default: from the model's kind, "
    "else /v1/chat/completions",
)
@click.option("--voice", help="speech only: the voice, for servers that need one")
@click.option(
    "--body",
    "body_file",
    type=click.File("r"),
    help="JSON file with the whole body; - for stdin (read from stdin without --model)",
)
@click.option("--priority", help="interactive, normal, batch, background or a number")
@click.option(
    "--max-wait",
    type=float,
    help="seconds the job may wait to start; refused at once if it cannot, expired if it waits",
)
@click.option(
    "--wait", "wait_end", is_flag=True, help="follow the job to its end, then print its result"
)
@click.option("--json", "as_json", is_flag=True, help="print the job as JSON")
@pass_client
def submit(
    client: Client,
    path_argument: str | None,
    model: str | None,
    prompt: str | None,
    path_option: str | None,
    voice: str | None,
    body_file: Any,
    priority: str | None,
    max_wait: float | None,
    wait_end: bool,
    as_json: bool,
) -> None:
    """Queue a job: `--model M --prompt TEXT` builds the body for chat, images
    or speech (the path from the model's kind, or --path); `--body FILE`, or
    stdin without --model, gives the JSON body llama-swap gets."""
    path, body = submission(
        path_argument=path_argument,
        path_option=path_option,
        model=model,
        prompt=prompt,
        voice=voice,
        body_file=body_file,
    )
    job = client.submit(path=path, body=body, priority=priority, max_wait=max_wait)
    if wait_end:
        job = client.wait(job["id"])
    click.echo(json.dumps(job) if as_json else job_line(job))
    if wait_end:
        if not as_json:
            click.echo(result_text(job))
        sys.exit(0 if job["status"] == "succeeded" else 1)


def submission(
    *,
    path_argument: str | None,
    path_option: str | None,
    model: str | None,
    prompt: str | None,
    voice: str | None,
    body_file: Any,
) -> tuple[str, dict[str, Any]]:
    """The path and body `submit`'s options describe."""
    if path_argument and path_option and path_argument != path_option:
        raise click.UsageError(f"two paths given: {path_argument} and --path {path_option}")
    path = path_option or path_argument
    if body_file is None and model is None:
        body_file = sys.stdin
    if body_file is None:
        assert model is not None
        if prompt is None:
            raise click.UsageError("--model needs --prompt TEXT to build the body (or --body FILE)")
        path = path or path_for_model(model)
        return path, body_for(path, model=model, prompt=prompt, voice=voice)
    if prompt is not None:
        raise click.UsageError("--prompt builds a body and --body gives one: use one of them")
    try:
        body = json.load(body_file)
    except ValueError as exc:
        raise click.UsageError(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise click.UsageError("the body must be a JSON object")
    if model is not None:
        body["model"] = model
    model_name = body.get("model")
    return path or (path_for_model(model_name) if isinstance(model_name, str) else CHAT), body


def result_text(job: dict[str, Any]) -> str:
    """What a finished job answered, for a person: a chat's reply, else the
    answer's JSON (or where a stored file is)."""
    result = job.get("result") or {}
    body = result.get("body")
    if isinstance(body, dict):
        with contextlib.suppress(LookupError, TypeError):
            return str(body["choices"][0]["message"]["content"])
        with contextlib.suppress(LookupError, TypeError):
            return str(body["choices"][0]["text"])
        return json.dumps(body)
    if body is not None:
        return str(body)
    if result:
        return f"result: GET /api/jobs/{job['id']}/result/"
    return job.get("error") or ""


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
@click.option(
    "--as-of",
    "as_of",
    metavar="ISO",
    help="a queued job's wait told at this instant (2026-01-01T12:00:00+00:00), not now",
)
@pass_client
def why(client: Client, job_id: int, as_of: str | None) -> None:
    """Why a job waited: the summary and its parts, which add up to the wait."""
    answer = client.why(job_id, as_of=as_of)
    console.print(answer["summary"])
    table = Table("part", "seconds", "job ahead", "decided by")
    for part in answer["parts"]:
        ahead = part.get("job") or {}
        swap = part.get("swap_seconds") or 0.0
        # A gpusched from before the shown tenths sent `seconds` alone.
        shown = part.get("shown_seconds", part["seconds"] + swap)
        table.add_row(
            part["kind"].replace("_", " "),
            f"{shown:.1f}" + (f" (of which {swap:.1f} swap)" if swap else ""),
            f"#{ahead['id']} {ahead['model']} band {ahead['band']:+d}" if ahead else "",
            part.get("reason", ""),
            end_section=part is answer["parts"][-1],
        )
    wait = answer.get("shown_wait_seconds", answer["measured_wait_seconds"])
    table.add_row("measured wait", f"{wait:.1f}", "", "")
    console.print(table)
    if not answer.get("adds_up", True):
        console.print(
            "warning: these parts do not add up to the wait: a defect in gpusched, "
            "logged for the operator with this job's id",
            style="bold red",
            highlight=False,
        )


@main.command()
@pass_client
def queue(client: Client) -> None:
    """Each GPU's running job, and the queue in dispatch order."""
    state = client.queue()
    running = state.get("running_all") or ([state["running"]] if state.get("running") else [])
    gpus = [gpu["name"] for gpu in state.get("gpus") or []]
    for name in [*gpus, *sorted({r["gpu"] or "" for r in running} - set(gpus))]:
        jobs = [r for r in running if (r["gpu"] or "") == name]
        label = name or "GPU"
        if not jobs:
            console.print(f"{label}: idle", highlight=False)
        for entry in jobs:
            console.print(f"{label}: {running_text(entry)}", highlight=False)
    if not gpus and not running:
        console.print("running: nothing")
    # "?": a guess, resting on a run of which nothing is known yet.
    table = Table("#", "job", "model", "band", "score", "member", "starts (estimate)")
    for entry in state["queued"]:
        table.add_row(
            str(entry["position"]),
            f"#{entry['id']}",
            entry["model"],
            f"{entry['priority']:+d}",
            f"{entry['score']['effective']:.2f}",
            entry["member"] or "another member",
            entry["estimated_start_at"][11:19] + (" ?" if entry.get("estimate_is_guess") else ""),
        )
    console.print(table)
    console.print(f"{state['queued_total']} queued")


def running_text(entry: dict[str, Any]) -> str:
    """A running job in one phrase: id, model, band, whose, for how long."""
    text = (
        f"running #{entry['id']} {entry['model']} band {entry['priority']:+d} · "
        f"{entry.get('member') or 'another member'} · {duration(_since(entry.get('started_at')))}"
    )
    return text + (" · running long" if entry.get("running_long") else "")


@main.command()
@pass_client
def gpus(client: Client) -> None:
    """The GPUs: health, loaded models and their jobs, running jobs, models served."""
    table = Table("gpu", "health", "loaded", "running", "models")
    for gpu in client.gpus():
        health = gpu.get("health") or _health_of_older_server(gpu)
        running = gpu.get("running_jobs") or ([gpu["running_job"]] if gpu["running_job"] else [])
        models = gpu.get("models")
        table.add_row(
            gpu["name"],
            health,
            resident_set(gpu),
            " ".join(f"#{job_id}" for job_id in running) or "idle",
            "any" if models is None else ", ".join(models),
        )
    console.print(table)


def _health_of_older_server(gpu: dict[str, Any]) -> str:
    """A server before `health` was added says it with `enabled` and `healthy`."""
    if not gpu["enabled"]:
        return "disabled"
    return {True: "healthy", False: "down", None: "not checked yet"}[gpu["healthy"]]


@main.command()
@pass_client
def models(client: Client) -> None:
    """The models the GPUs serve: parallel slots and which GPUs."""
    table = Table("model", "parallel", "from", "gpus")
    for model in client.models():
        table.add_row(
            model["name"],
            str(model["parallel"]),
            model.get("parallel_source") or "",  # a server before it was added says nothing
            ", ".join(model["gpus"]),
        )
    console.print(table)


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
