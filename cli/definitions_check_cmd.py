"""``saga definitions check`` and ``saga definitions diff``: what new definitions would do to running sagas,
before they are deployed.

``check`` replays each running saga's history on the deployed definitions (the environment's deployment) and on
the candidate ones (``--definitions`` or ``--app``) and compares their next decisions
(``orchestrator.domain.replay_check``). The histories come from the event store, or from files ``saga history
--json`` wrote. ``diff`` lists the changes between two definitions of a saga type with their verdicts
(``orchestrator.domain.changes``).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer._click import Context as ClickContext  # the click typer vendors: its groups' parse_args takes it
from typer.core import TyperGroup

from ..infra.deployment import Deployment, load_deployment
from ..infra.misconfigured import Misconfigured
from ..infra.references import load_reference, load_references
from ..operations.versions import on_old_path
from ..orchestrator.bootstrap import registry_of
from ..orchestrator.domain.changes import Verdict, diff, verdict
from ..orchestrator.domain.definition import DefinitionRegistry, SagaDefinition
from ..orchestrator.domain.errors import DomainError
from ..orchestrator.domain.replay_check import Outcome, ReplayVerdict, check_history
from ..schemas import event_types as ev
from ..schemas import wire
from .context import console, database, deployed_definitions, fail, run, settings
from .definitions_cmd import definitions_command, version_counts_or_why
from .definitions_migrate_cmd import migrate

PROGRESS_EVERY = 10_000
"""Sagas between two progress lines on stderr."""

DIFF_EXIT = {Verdict.SAFE: 0, Verdict.PATCH: 1, Verdict.VERSION: 3}
"""``saga definitions diff``'s exit code by the worst verdict (2: the definitions could not be compared)."""


class DefinitionsGroup(TyperGroup):
    """``saga definitions [TYPE] [--json]`` lists the deployed definitions; ``saga definitions check|diff ...``
    runs a subcommand. A first word that names no subcommand is the listing's TYPE."""

    def parse_args(self, ctx: ClickContext, args: list[str]) -> list[str]:
        words = [arg for arg in args if not arg.startswith("-")]
        if words and words[0] not in self.commands:
            args = list(args)
            args.remove(words[0])
            ctx.meta["saga_definitions_type"] = words[0]
        return super().parse_args(ctx, args)


definitions_app = typer.Typer(cls=DefinitionsGroup, invoke_without_command=True, no_args_is_help=False,
                              add_completion=False)


@definitions_app.callback()
def definitions(ctx: typer.Context,
                as_json: bool = typer.Option(False, "--json", help="As JSON, one object per definition version.")
                ) -> None:
    """Show each saga type's versions (saga definitions [TYPE]): input record, deadline, and its steps in the
    order they can run; ``check`` and ``diff`` say what new definitions would do to running sagas, ``migrate``
    moves running sagas to another deployed version."""
    if ctx.invoked_subcommand is None:
        definitions_command(ctx.meta.get("saga_definitions_type"), as_json)


def candidate_registry(definitions: str | None, app: str | None) -> DefinitionRegistry:
    """The registry of the candidate deployment, loaded as a deployment is (``infra.deployment``): named by
    ``--app`` (a SagaApp), else by ``--definitions`` (references, as SAGA_DEFINITIONS lists them)."""
    if (definitions is None) == (app is None):
        fail("name the candidate definitions: --definitions module:ATTR,... or --app module:app (one of them)")
    try:
        if definitions is not None:  # exactly these: not an app the working directory's pyproject.toml names
            try:
                found = load_references(definitions)
            except ValueError as error:
                raise Misconfigured(f"--definitions {definitions!r}: {error}") from None
            return registry_of(Deployment(found, [], "", None, f"--definitions {definitions!r}"))
        return registry_of(load_deployment(settings().model_copy(update={"saga_app": app})))
    except Misconfigured as refused:
        fail(f"candidate: {refused}")


def read_history_files(paths: Sequence[Path]) -> dict[str, list[ev.Event]]:
    """Each saga's events from files ``saga history --json`` wrote (a directory: every ``*.json`` and ``*.jsonl``
    file in it), by saga id, in seq order. A file holds JSON objects one after another (pretty-printed or one a
    line), each one event; ValueError names a file that holds anything else."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl") and p.is_file())
        else:
            files.append(path)
    histories: dict[str, list[ev.Event]] = {}
    for file in files:
        for number, record in enumerate(_json_objects(file.read_text(encoding="utf-8")), start=1):
            try:
                event = event_from_json(record)
            except (KeyError, TypeError, ValueError) as error:
                raise ValueError(f"{file}: object {number} is no saga event ({error})") from None
            histories.setdefault(event.saga_id, []).append(event)
    for events in histories.values():
        events.sort(key=lambda event: event.seq)
    return histories


def _json_objects(text: str) -> Iterator[Any]:
    decoder = json.JSONDecoder()
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return
        found, position = decoder.raw_decode(text, position)
        yield found


_EVENT_TYPES: dict[str, type[ev.Event]] = {
    cls.__name__: cls for cls in vars(ev).values()
    if isinstance(cls, type) and issubclass(cls, ev.Event) and cls is not ev.Event
}


def event_from_json(record: dict[str, Any]) -> ev.Event:
    """The event ``saga history --json`` printed as ``record`` (bytes as hex, tuples as lists)."""
    cls = _EVENT_TYPES[record["event"]]
    values: dict[str, Any] = {}
    for field in fields(cls):
        if field.name not in record:
            continue
        value = record[field.name]
        kind = str(field.type)
        if "bytes" in kind and isinstance(value, str):
            value = bytes.fromhex(value)
        elif "tuple" in kind and isinstance(value, list):
            value = tuple(tuple(item) if isinstance(item, list) else item for item in value)
        values[field.name] = value
    return cls(**values)


async def stored_histories() -> dict[str, list[bytes]]:
    """The stored events (encoded) of every saga that has not ended, by saga id, from the event store of the
    environment's deployment (``ShapeStore.running_histories``: ended ones are not read)."""
    from ..operations.postgres import event_store

    async with database(settings()) as pool:
        return await event_store(pool).running_histories()


def check_encoded(deployed: DefinitionRegistry, candidate: DefinitionRegistry,
                  histories: Iterable[tuple[str, Sequence[bytes]]],
                  progress: Callable[[int], None] | None = None) -> list[ReplayVerdict]:
    """``check_history`` of each stored history (events as the store keeps them); one that cannot be decoded is
    WOULD_NOT_FOLD. ``progress`` is called with the count done every ``PROGRESS_EVERY`` sagas."""
    verdicts = []
    for done, (saga_id, bodies) in enumerate(histories, start=1):
        try:
            events = [wire.decode_event(body) for body in bodies]
        except Exception as error:  # a value of no known schema: nothing can be decided from it
            verdicts.append(ReplayVerdict(saga_id, Outcome.WOULD_NOT_FOLD, f"cannot decode its events: {error}"))
            continue
        verdicts.append(check_history(deployed, candidate, events))
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(done)
    return verdicts


@definitions_app.command("check")
def check(
    definitions: str | None = typer.Option(None, "--definitions", metavar="module:ATTR,...",
                                           help="The candidate definitions, as SAGA_DEFINITIONS names them."),
    app: str | None = typer.Option(None, "--app", metavar="module:app", help="The candidate app (a SagaApp)."),
    histories: Annotated[list[Path] | None, typer.Option(
        "--histories", exists=True,
        help="Files `saga history --json` wrote, or directories of them (repeatable); default: the event store.")
    ] = None,
    as_json: bool = typer.Option(False, "--json", help="One JSON object: every checked saga and the counts."),
    patch: str | None = typer.Option(None, "--patch", metavar="NAME", help=(
        "Instead: can any running saga still take the old path of patch marker NAME (of the candidate, else the "
        "deployed definitions)? Exit 0 when none can: the marker can be removed.")),
) -> None:
    """Would each running saga take its next step the same way on the candidate definitions?

    One line per running saga: `same next decision`, `different next decision` (the message that would be
    decided otherwise, and both decisions), or `would not fold` (why). Ended sagas are not read from the event
    store; in history files they are counted as skipped. A saga that would take a patch (a step added in place
    behind a marker) where it stands is reported as such, and passes.
    Exit code 1 when any saga is different or would not fold, 0 otherwise, 2 when the check cannot run.
    """
    if patch is not None:
        check_patch(patch, deployed_definitions() if definitions is None and app is None
                    else candidate_registry(definitions, app), as_json)
    candidate = candidate_registry(definitions, app)
    deployed = deployed_definitions()
    started = time.monotonic()

    def progress(done: int) -> None:
        print(f"checked {done} sagas ({done / (time.monotonic() - started):,.0f}/s)", file=sys.stderr)

    if histories:
        try:
            decoded = read_history_files(histories)
        except (FileNotFoundError, PermissionError, ValueError) as error:  # a file missing, unreadable or no history
            fail(str(error))
        verdicts = []
        for done, events in enumerate(decoded.values(), start=1):
            verdicts.append(check_history(deployed, candidate, events))
            if done % PROGRESS_EVERY == 0:
                progress(done)
    else:
        stored = run(stored_histories())
        verdicts = check_encoded(deployed, candidate, stored.items(), progress)
    report(verdicts, as_json)


def check_patch(patch: str, registry: DefinitionRegistry, as_json: bool) -> NoReturn:
    """``check --patch``: the running sagas on the old path of ``patch``, from one count of the read model; exit 1
    when there are any, 0 when there are none."""
    counts, unavailable = run(version_counts_or_why())
    if counts is None:
        fail(f"cannot count the running sagas: {unavailable}")
    try:
        old = on_old_path(registry, counts, patch)
    except ValueError as error:
        fail(str(error))
    total = sum(group.running for group in old)
    if as_json:
        typer.echo(json.dumps({"patch": patch, "ok": not old, "running_on_old_path": total, "shapes": [
            {"saga_type": g.saga_type, "version": g.version, "fingerprint": g.fingerprint, "running": g.running}
            for g in old]}))
    else:
        for group in old:
            typer.echo(f"{group.saga_type} v{group.version}: {group.running} running saga"
                       f"{'s' if group.running != 1 else ''} on shape {group.fingerprint or 'unrecorded'} can still "
                       f"take the old path of patch {patch!r}")
        typer.echo(f"patch {patch!r}: {total} running saga{'s' if total != 1 else ''} can still take the old path; "
                   "keep the marker until they end" if old else
                   f"patch {patch!r}: no running saga can take the old path; its marker can be removed")
    raise typer.Exit(1 if old else 0)


def report(verdicts: Sequence[ReplayVerdict], as_json: bool) -> None:
    """Print ``verdicts`` (skipped sagas only counted) and exit 1 when any failed."""
    counts = Counter(verdict.outcome.name for verdict in verdicts)
    shown = sorted((verdict for verdict in verdicts if verdict.outcome is not Outcome.SKIPPED),
                   key=lambda verdict: verdict.saga_id)
    failed = any(verdict.failed for verdict in verdicts)
    if as_json:
        typer.echo(json.dumps({
            "ok": not failed, "counts": {outcome.name: counts[outcome.name] for outcome in Outcome},
            "sagas": [{"saga_id": v.saga_id, "verdict": v.outcome.name, "detail": v.detail} for v in shown]}))
    else:
        for found in shown:
            detail = f": {found.detail}" if found.detail else ""
            typer.echo(f"{found.saga_id}  {found.outcome}{detail}")
        typer.echo(", ".join(f"{counts[outcome.name]} {outcome}" for outcome in Outcome))
    raise typer.Exit(1 if failed else 0)


@definitions_app.command("diff")
def diff_command(
    old: str = typer.Argument(..., metavar="OLD", help="module:ATTR of the definition running now."),
    new: str = typer.Argument(..., metavar="NEW", help="module:ATTR of the definition to deploy."),
    as_json: bool = typer.Option(False, "--json", help="As JSON: the changes and the verdict."),
) -> None:
    """Each change from OLD to NEW, two definitions of one saga type, with what it means for running sagas.

    Exit code: 0 when every change is safe (or there is none), 1 when one needs a patch marker, 3 when one needs
    a new version, 2 when the two cannot be compared.
    """
    definitions = [_definition(reference) for reference in (old, new)]
    try:
        changes = diff(*definitions)
    except DomainError as error:
        fail(str(error))
    worst = verdict(changes)
    if as_json:
        typer.echo(json.dumps({"verdict": worst.name, "changes": [
            {"step": change.step, "what": change.what, "verdict": change.verdict.name} for change in changes]}))
    else:
        for change in changes:
            console.print(f"{change.verdict.name:<8} {change.what}", highlight=False, soft_wrap=True)
        console.print(f"{len(changes)} change{'s' if len(changes) != 1 else ''}: {worst}", highlight=False)
    raise typer.Exit(DIFF_EXIT[worst])


definitions_app.command("migrate")(migrate)


def _definition(reference: str) -> SagaDefinition:
    try:
        found = load_reference(reference)
    except ValueError as error:
        fail(str(error))
    if not isinstance(found, SagaDefinition):
        fail(f"{reference} names {type(found).__name__}, not a SagaDefinition")
    return found


__all__ = ["definitions_app"]
