"""The ``bubblescope`` command: serve, demo, db upgrade|current, token create|list|revoke, upload-spool, plan,
trace-summary."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from bubblescope import stop_signal
from bubblescope.analysis import (
    CHOICES,
    DEFAULT_SCHEDULE,
    GPU_CATALOG,
    MODEL_PRESETS,
    NAMES,
    ScheduleError,
    lookup,
)
from bubblescope.input_files import missing_files
from bubblescope.ports import can_listen, taken_message


def schedule_argument(text: str) -> str:
    """A schedule by any of its names (``zbv``, ``ZBVZeroBubble``, ``ScheduleZBVZeroBubble``) → its short name."""
    try:
        return lookup(text).name
    except ScheduleError as error:
        raise argparse.ArgumentTypeError(error.message) from None


def _serve(args: argparse.Namespace) -> int:
    from bubblescope.backend.auth.commands import exposure_refusal, missing_token_warning
    from bubblescope.backend.db.prepare import DatabaseNotReady, prepare_database, shown_url
    from bubblescope.backend.server import build_server
    from bubblescope.backend.settings import from_options

    try:
        settings = from_options(args)
    except ValueError as error:
        print(f"bubblescope serve: {error}", file=sys.stderr)
        return 2
    refusal = exposure_refusal(args.host, settings)
    if refusal:
        print(f"bubblescope serve: {refusal}", file=sys.stderr)
        return 2
    if not can_listen(args.host, args.port):
        print(taken_message("serve", args.host, args.port), file=sys.stderr)
        return 2
    try:
        url = prepare_database(args.db)
        server = build_server(url, args.host, args.port, settings)
    except (DatabaseNotReady, ValueError) as error:  # ValueError: an unusable --webhook-secret-file
        print(f"bubblescope serve: {error}", file=sys.stderr)
        return 2
    warning = missing_token_warning(url, args.db) if settings.auth else None
    if warning:
        print(f"bubblescope serve: {warning}", file=sys.stderr, flush=True)
    print(f"bubblescope service on http://{args.host}:{args.port} (database {shown_url(url)})", flush=True)
    server.run()
    return 0


def _db(args: argparse.Namespace) -> int:
    from bubblescope.backend.db import migrate
    from bubblescope.backend.db.engine import build_engine
    from bubblescope.backend.db.prepare import default_db_url

    url = args.db or default_db_url()
    if args.db_command == "upgrade":
        migrate.upgrade(url)
    engine = build_engine(url)
    print(f"schema revision {migrate.current_revision(engine)} (head {migrate.head_revision(url)})")
    return 0


def _token(args: argparse.Namespace) -> int:
    from bubblescope.backend.auth.commands import token_command

    return token_command(args)


def _trace_summary(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from bubblescope.kineto import TraceError
    from bubblescope.trace_summary import format_table, summarize

    stop_signal.install()
    refusal = missing_files("trace-summary", args.traces)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    try:
        summaries = summarize([Path(path) for path in args.traces])
    except TraceError as error:
        print(f"bubblescope trace-summary: {error}", file=sys.stderr)
        return 2
    print(json.dumps([s.as_json() for s in summaries], indent=1) if args.json else format_table(summaries))
    return 0


def _import_trace(args: argparse.Namespace) -> int:
    from bubblescope.import_trace_command import main

    stop_signal.install()
    return main(args)


def _import_fr(args: argparse.Namespace) -> int:
    from bubblescope.fr_command import main

    return main(args)


def _upload(args: argparse.Namespace) -> int:
    from bubblescope.collector import upload_spool

    try:
        result = upload_spool(args.spool_dir, args.url, args.token)
    except ValueError as error:
        print(f"bubblescope upload-spool: {error}", file=sys.stderr)
        return 2
    print(
        f"delivered {result.delivered}, rejected {result.rejected}, still spooled {result.remaining}, "
        f"unreadable (set aside as *.bad) {result.unreadable}"
    )
    if result.refused_token is not None:
        print(
            f"bubblescope upload-spool: the service refused the token ({result.refused_token}); nothing was "
            "removed: give an ingest token with --token or BUBBLESCOPE_TOKEN and run it again",
            file=sys.stderr,
        )
    if result.misaddressed is not None:
        print(
            f"bubblescope upload-spool: {result.misaddressed}; nothing was removed: give the service's root URL "
            "(http://HOST:PORT) with --url or BUBBLESCOPE_URL and run it again",
            file=sys.stderr,
        )
    return 0 if result.remaining == 0 else 1


def _demo(args: argparse.Namespace) -> int:
    from bubblescope.demo import main

    return main(args)


def _plan_source(value: str, option: str) -> object:
    """A preset name as given, or the parsed content of a JSON file."""
    import json
    from pathlib import Path

    if not (value.endswith(".json") or Path(value).is_file()):
        return value
    from bubblescope.analysis import refuse_repeated_keys, unique_json_object

    try:
        document = json.loads(Path(value).read_text(), object_pairs_hook=unique_json_object)
        refuse_repeated_keys(document)
        return document
    except (OSError, ValueError) as error:
        raise ValueError(f"{option}: cannot read JSON file {value!r}: {error}") from None


class _StoreOnce(argparse.Action):
    """An option that takes one value: given twice, the command refuses it (exit 2) instead of keeping the last."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option: str | None = None
    ) -> None:
        given: set[str] = namespace.__dict__.setdefault("_given_once", set())
        if self.dest in given:
            parser.error(f"{option} given twice; give it once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


def _key_values(texts: list[str] | None, option: str) -> dict[str, str] | None:
    """The K=V pairs of every time ``option`` was given (``--fix tp=2 --fix pp=2`` holds both), a key given twice
    refused."""
    if texts is None:
        return None
    pairs: dict[str, str] = {}
    for item in filter(None, (part.strip() for text in texts for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{option}: expected K=V[,K=V...], got {item!r}")
        if key.strip() in pairs:
            raise ValueError(f"{option}: {key.strip()} given twice")
        pairs[key.strip()] = value.strip()
    return pairs


def _plan(args: argparse.Namespace) -> int:
    import json

    from bubblescope.analysis import PlanInputError, nothing_fits, plan_document, render_outcome

    try:
        if (args.cluster is None) == (args.gpu is None):
            raise ValueError("cluster: give --cluster NAME|FILE, or --gpu TYPE --gpus N [--gpus-per-node K]")
        if args.cluster is not None and (args.gpus is not None or args.gpus_per_node is not None):
            raise ValueError("cluster: --gpus and --gpus-per-node go with --gpu; a --cluster names its own")
        if args.gpu is not None and args.gpus is None:
            raise ValueError(f"cluster: --gpu {args.gpu} needs --gpus N, how many GPUs the job runs on")
        cluster = (
            _plan_source(args.cluster, "--cluster")
            if args.cluster is not None
            else {
                "gpu": args.gpu,
                "gpus": args.gpus,
                "gpus_per_node": 8 if args.gpus_per_node is None else args.gpus_per_node,
            }
        )
        document = {
            "model": _plan_source(args.model, "--model"),
            "cluster": cluster,
            "global_batch": args.global_batch,
            "config": _key_values(args.config, "--config"),
            "fixed": _key_values(args.fix, "--fix"),
            "top": args.top,
        }
        outcome = plan_document(document)
    except (PlanInputError, ValueError) as error:
        print(f"bubblescope plan: {error}", file=sys.stderr)
        return 2
    if args.json:
        for plan in outcome.plans:  # each line says the defaults it relied on, as the API's answer does
            print(json.dumps({**plan.as_dict(), "assumed": list(outcome.assumed)}))
        if not outcome.plans:  # nothing on stdout: one line on stderr says why, as the text output does
            print(f"bubblescope plan: {nothing_fits(outcome)}", file=sys.stderr)
    else:
        print(render_outcome(outcome))
    return 0 if outcome.plans else 1


def _prometheus_rules(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from bubblescope.analysis import DEFAULT_THRESHOLDS, prometheus_rules

    thresholds = replace(
        DEFAULT_THRESHOLDS,
        silent_after_s=args.silent_after,
        regression_percent=args.regression_percent,
        regression_for_s=args.regression_for,
        bubble_over_floor_points=args.bubble_over_floor_points,
    )
    print(prometheus_rules(thresholds), end="")
    return 0


def _prometheus_rules_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from bubblescope.analysis import DEFAULT_THRESHOLDS

    rules = commands.add_parser(
        "prometheus-rules",
        help="print Prometheus alerting rules over GET /metrics, from the service's alert registry",
        description="The rules deploy/prometheus/bubblescope-rules.yml holds (serve's default thresholds), or with "
        "your thresholds: give the values you give serve (docs/metrics.md#alerting-from-prometheus).",
    )
    t = DEFAULT_THRESHOLDS
    for option, default, what in (
        ("--silent-after", t.silent_after_s, "serve --silent-after, seconds (named in a comment)"),
        ("--regression-percent", t.regression_percent, "step-time regression: this much slower, percent"),
        ("--regression-for", t.regression_for_s, "step-time regression: for this long, seconds"),
        ("--bubble-over-floor-points", t.bubble_over_floor_points, "bubble above floor: points (of 100)"),
    ):
        rules.add_argument(option, type=_positive_float, default=default, help=f"{what} (default: %(default)s)")
    rules.set_defaults(handler=_prometheus_rules)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from bubblescope.backend.settings import serve_options  # standard library only, like this module

    parser = argparse.ArgumentParser(prog="bubblescope", description="Pipeline-bubble diagnostics for PyTorch training")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="run the service",
        description="Run the service: ingest from collectors, the dashboard, the API, /metrics and the alerts. "
        "The database is migrated first. A taken port is refused before anything starts (exit 2).",
    )
    serve.add_argument(
        "--db",
        help="SQLAlchemy URL or SQLite file path (default: $BUBBLESCOPE_DB, else bubblescope.db in the user data dir; "
        "a URL with a password belongs in the environment, not on a command line)",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s; any other address needs --auth, or --insecure)",
    )
    serve.add_argument("--port", type=int, default=8765, help="port to listen on (default: %(default)s)")
    serve_options(serve)
    serve.set_defaults(handler=_serve)

    demo = commands.add_parser(
        "demo",
        help="service + a real CPU pipeline-parallel job streaming into it",
        description="Start the service on embedded SQLite and a real torchrun pipeline job (gloo, CPU) streaming "
        "into it; prints the run's page. Serves until Ctrl-C unless --exit-after-job.",
    )
    demo.add_argument(
        "--schedule",
        type=schedule_argument,
        default=DEFAULT_SCHEDULE.name,
        metavar="|".join(NAMES),
        help="pipeline schedule, any of these or torch's class name (default: %(default)s)",
    )
    demo.add_argument(
        "--stages",
        type=int,
        default=None,
        help="pipeline stages = processes (default: 4, or fewer on a machine of fewer cores, at least 2)",
    )
    demo.add_argument(
        "--microbatches", type=int, default=None, help="micro-batches per step (default: as many as stages)"
    )
    demo.add_argument("--steps", type=int, default=20, help="training steps (default: %(default)s)")
    demo.add_argument(
        "--hidden", type=int, default=2048, help="the MLP's width: compute outweighs the runtime (default: %(default)s)"
    )
    demo.add_argument(
        "--layers-per-stage", type=int, default=2, help="linear layers on each stage (default: %(default)s)"
    )
    demo.add_argument(
        "--microbatch-size",
        type=int,
        default=None,
        help="samples per micro-batch (default: the job's batch of 256 split into the micro-batches)",
    )
    demo.add_argument("--url", help="stream into this running service; no service is started")
    demo.add_argument("--no-serve", action="store_true", help="start no service (needs --url)")
    demo.add_argument("--db", help="database for the embedded service (default: user data dir)")
    demo.add_argument("--host", default="127.0.0.1", help="the embedded service's address (default: %(default)s)")
    demo.add_argument(
        "--port",
        type=int,
        default=0,
        help="service port (default: 8765, or a free one if taken; a taken --port: exit 2)",
    )
    demo.add_argument("--exit-after-job", action="store_true", help="stop serving when the job ends")
    demo.add_argument(
        "--tour",
        action="store_true",
        help="instead of one job, the textbook lessons one after another (naive split and pipelined, unequal "
        "stages and rebalanced, DDP with a late rank, FSDP2, DP×PP, a crash, a hang, 1,024 ranks replayed): a few "
        "minutes; the job's size options do not apply",
    )
    demo.set_defaults(handler=_demo)

    db = commands.add_parser("db", help="database schema (Alembic migrations)", description="The database's schema.")
    db_commands = db.add_subparsers(dest="db_command", metavar="{upgrade,current}")
    for name, text in (
        ("upgrade", "migrate the database to the newest schema (serve does it at start), then print the revision"),
        ("current", "print the database's schema revision and the newest one"),
    ):
        sub = db_commands.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        sub.add_argument("--db", help="SQLAlchemy URL or SQLite file path (default: the one serve uses)")
        sub.set_defaults(handler=_db)
    db.set_defaults(handler=_help_of(db))

    _token_parser(commands)

    upload = commands.add_parser(
        "upload-spool",
        help="send spooled batches to a service",
        description="Send what collectors spooled (the service was down, refused the token or the URL was wrong), "
        "oldest first; delivered batches are removed. Exit 1 while anything stays spooled.",
    )
    upload.add_argument("--url", help="the service (default: BUBBLESCOPE_URL)")
    upload.add_argument("--token", help="bearer token (default: BUBBLESCOPE_TOKEN)")
    upload.add_argument("--spool-dir", help="spool folder (default: BUBBLESCOPE_SPOOL_DIR, else the collector's)")
    upload.set_defaults(handler=_upload)

    summary = commands.add_parser(
        "trace-summary",
        help="per rank: Holistic Trace Analysis' figures and ours, from torch.profiler traces",
        description="Read torch.profiler (Kineto) traces, JSON plain or gzip, one file per rank (the rank from the "
        "trace's distributedInfo, else from a file name like rank3.json.gz), and print per rank HTA's temporal "
        "breakdown, idle time by cause and communication overlap, computed here, beside our own split.",
    )
    summary.add_argument("traces", nargs="+", metavar="TRACE", help="trace files, one per rank")
    summary.add_argument("--json", action="store_true", help="print JSON instead of a table")
    summary.set_defaults(handler=_trace_summary)

    imported = commands.add_parser(
        "import-trace",
        help="store torch.profiler traces as a run, analysed like a collected one",
        description="Read torch.profiler (Kineto) traces, JSON plain or gzip, one file per rank (the rank from the "
        "trace's distributedInfo, else from a file name like rank3.json.gz), and store them as a run: steps from "
        "ProfilerStep#N, GPU kernels as compute and communication (NCCL kernels of every generation), process groups "
        "from the traces. Every file is read before anything is sent; importing the same files again stores nothing "
        "twice. docs/traces.md.",
    )
    imported.add_argument("traces", nargs="+", metavar="TRACE", help="trace files, one per rank")
    imported.add_argument("--run", metavar="NAME", help="the run's name, and its key (default: the first file's name)")
    where = imported.add_mutually_exclusive_group()
    where.add_argument("--url", help="the service to send it to (default: BUBBLESCOPE_URL)")
    where.add_argument(
        "--db",
        metavar="URL",
        help="store it straight into this database instead (sqlite:///… or postgresql+psycopg://…), migrated first "
        "as serve does",
    )
    imported.add_argument("--token", help="bearer token with the ingest scope (default: BUBBLESCOPE_TOKEN)")
    imported.add_argument(
        "--schedule",
        metavar="NAME",
        help="the pipeline schedule the job ran (1f1b, gpipe, interleaved1f1b, ...; torch's class names too): no trace "
        "names it; with it, the stages and micro-batches torch annotates get the bubble's replay and causes",
    )
    imported.set_defaults(handler=_import_trace)

    flight = commands.add_parser(
        "import-fr",
        help="read PyTorch Flight Recorder dumps: where each rank's collectives stand, who is missing",
        description="Read PyTorch Flight Recorder dumps, one per rank (the pickle torch writes, or its JSON; the "
        "rank from the file name, as torch names them: nccl_trace_rank_3), and print per process group each "
        "rank's last enqueued, started and completed collective, the first collective not every rank joined and "
        "the ranks missing from it, and collectives whose ranks disagree on op, sizes or dtypes. A pickle is read "
        "with an unpickler that builds plain values only. docs/traces.md.",
    )
    flight.add_argument("dumps", nargs="+", metavar="DUMP", help="dump files, one per rank")
    flight.add_argument("--json", action="store_true", help="print the report as JSON")
    flight.add_argument("--url", help="also upload them to this service, as the run's dumps (its page shows them)")
    flight.add_argument("--run", metavar="KEY", help="the run they belong to (with --url)")
    flight.add_argument("--token", help="bearer token with the ingest scope (default: BUBBLESCOPE_TOKEN)")
    flight.set_defaults(handler=_import_fr)

    plan = commands.add_parser(
        "plan",
        help="predict memory, step time and MFU of parallel configurations",
        description="Evaluate one configuration (--config) or search for the fastest that fit (ranked). "
        f"Model presets: {', '.join(MODEL_PRESETS)}; clusters <gpu>-x<count>, e.g. a100-80gb-x64.",
    )
    plan.add_argument(
        "--model", action=_StoreOnce, required=True, help="model preset name or JSON file of model fields"
    )
    plan.add_argument(
        "--cluster", action=_StoreOnce, help="cluster preset (<gpu>-x<count>) or JSON file {gpu, gpus, gpus_per_node}"
    )
    plan.add_argument(
        "--gpu",
        action=_StoreOnce,
        help=f"instead of --cluster: GPU type ({', '.join(gpu.name for gpu in GPU_CATALOG.values())})",
    )
    plan.add_argument("--gpus", action=_StoreOnce, type=int, help="with --gpu: number of GPUs")
    plan.add_argument("--gpus-per-node", action=_StoreOnce, type=int, help="with --gpu (default 8)")
    plan.add_argument("--global-batch", action=_StoreOnce, type=int, required=True, help="sequences per optimizer step")
    plan.add_argument(
        "--config",
        action="append",
        help="evaluate this configuration (may be repeated: one configuration, its fields merged): K=V,... with tp, pp, dp, vpp, mbs, schedule, "
        f"zero, {_words('recompute')}, sp, flash (default true), {_words('precision')}, "
        f"layers_per_stage (7/8/8/7), first_stage_layers, last_stage_layers, tp_overlap, cp, {_words('cp_comm')}, "
        f"ep, etp (experts' own tp, default tp), {_words('dispatcher')}, capacity_factor, {_words('grad_reduce')}, "
        f"compile (default true), fp8_all_gather, {_words('attention_kernel')}, kv_repeated, overlap_param_gather, "
        f"{_words('projections')}",
    )
    plan.add_argument(
        "--fix", action="append", help="search holding these K=V,... fields (may be repeated: the fields merged)"
    )
    plan.add_argument(
        "--top", action=_StoreOnce, type=int, default=10, help="configurations to list when searching (default 10)"
    )
    plan.add_argument(
        "--json", action="store_true", help="one JSON object per configuration per line, with the defaults assumed"
    )
    plan.set_defaults(handler=_plan)
    _prometheus_rules_parser(commands)
    _describe(parser)
    return parser


def _words(field: str) -> str:
    """A few-word planner field and its words, from the one list the planner checks: ``recompute (none|...)``."""
    return f"{field} ({'|'.join(CHOICES[field])})"


def _describe(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's ``--help`` opens with its one-line help where it has no description of its own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if sub.description is None and helps.get(name):
                    text = str(helps[name])
                    sub.description = text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")
                _describe(sub)


def _token_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from bubblescope.backend.auth.scopes import SCOPE_NAMES  # standard library only, like this module

    token = commands.add_parser(
        "token", help="API tokens for serve --auth (docs/access.md)", description="API tokens for serve --auth."
    )
    token_commands = token.add_subparsers(dest="token_command", metavar="{create,list,revoke}")
    create = token_commands.add_parser("create", help="create a token and print it (the only time it is shown)")
    create.add_argument("--scope", required=True, choices=SCOPE_NAMES, help="admin grants read and ingest too")
    create.add_argument("--name", required=True, help="who or what holds it (letters, digits, . _ : @ -)")
    create.add_argument(
        "--value-env",
        metavar="VAR",
        help="take the token's text from this environment variable instead of generating one; "
        "nothing changes when that token exists already with this scope",
    )
    create.add_argument(
        "--runs",
        metavar="KEYS",
        help="bind the token to these runs: run keys or key prefixes ending in *, comma-separated "
        "('team-a-*,nightly'); an ingest token then writes only those, a read token sees only those "
        "(default: every run)",
    )
    listing = token_commands.add_parser("list", help="name, scope, runs, prefix, created, last used, revoked")
    revoke = token_commands.add_parser("revoke", help="revoke a token: refused within seconds")
    revoke.add_argument(
        "name_or_prefix", metavar="NAME_OR_PREFIX", help="the token's name, or its prefix as list shows it"
    )
    for sub in (create, listing, revoke):
        sub.add_argument("--db", help="SQLAlchemy URL or SQLite file path (default: $BUBBLESCOPE_DB, as serve)")
        sub.set_defaults(handler=_token)
    token.set_defaults(handler=_help_of(token))


def _help_of(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """A command given without its subcommand: its help, on stderr, and exit 2."""

    def show(_args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return show


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.handler(args))
    except ModuleNotFoundError as error:
        print(
            f"bubblescope {args.command}: missing {error.name!r}; install bubblescope[server] (and torch for the demo)",
            file=sys.stderr,
        )
        return 2
    except BrokenPipeError:  # the reader left (``plan ... | head -1``): what it read is the answer, no traceback
        _silence_stdout()
        return 0
    return stop_signal.EXIT if stop_signal.requested() else code  # a SIGTERM whose exit was lost (stop_signal)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of a closed pipe raises nothing (Python's
    documented way to leave quietly when a pipe's reader has gone)."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
