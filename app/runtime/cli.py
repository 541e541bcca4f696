"""The ``dpquant`` command: serve, worker, migrate, create-key, openapi, experiments, ingest,
backup, restore."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from app.core.config import Settings

logger = logging.getLogger("dpquant")

OPENAPI_PATH = Path("openapi") / "openapi.json"


def configure_logging(level: str) -> None:
    """Plain logging to stderr; pgserver's chatter is kept at WARNING."""
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("pgserver", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _exit_normally(signum: int, frame: object) -> None:
    raise SystemExit(0)


def ensure_metrics_dir() -> str | None:
    """Point ``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory unless it is set.

    Returns the directory created here (removed at exit), or None. Must run before
    ``prometheus_client`` is imported in this process; child processes (uvicorn web workers,
    release workers) inherit the variable and all write their metrics files there, so a
    scrape of any web worker sums every process (app/core/metrics.py).
    """
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="dpquant-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    atexit.register(shutil.rmtree, path, True)
    return path


def start_release_workers(concurrency: int) -> subprocess.Popen[bytes] | None:
    """``dpquant worker`` as a child process (it inherits the environment and the URL)."""
    if concurrency <= 0:
        return None
    return subprocess.Popen(
        [sys.executable, "-m", "app.runtime.cli", "worker", "--concurrency", str(concurrency)]
    )


def stop_release_workers(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the worker supervisor and wait for it (it lets runs finish, then stops)."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    """Start the embedded database if needed, migrate it, start release workers, run uvicorn."""
    ensure_metrics_dir()  # before anything imports prometheus_client
    import uvicorn

    from app.core.db import resolve_database_url, upgrade_database
    from app.runtime.webprocs import claim_port, reuseport_available, run_web_processes

    # The port first: a server that cannot listen (another one has it) starts nothing and
    # changes nothing, the bootstrap key included.
    try:
        claim = claim_port(args.host, args.port)
    except OSError as exc:
        logger.error("cannot listen on %s:%d (%s)", args.host, args.port, exc.strerror)
        return 1
    url, embedded = resolve_database_url(settings)
    if embedded:
        upgrade_database(url)
        # Web and worker processes inherit the URL, so the embedded server starts once, here.
        os.environ["DPQUANT_DATABASE_URL"] = url
    _reconcile_bootstrap_key(url, settings)
    release_workers = settings.workers if args.release_workers is None else args.release_workers
    base = f"http://{args.host}:{args.port}"
    _write(f"dpquant listening on {base} (API docs: {base}/docs)")
    _write(
        "database: "
        + (
            "embedded PostgreSQL under " + str(settings.data_dir)
            if embedded
            else "DPQUANT_DATABASE_URL"
        )
    )
    _write(admin_key_banner(settings))
    _write(
        f"release workers: {release_workers} process(es) on this machine"
        + ("" if release_workers else " (run `dpquant worker` elsewhere, or releases wait)")
    )
    # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, through whatever handler
    # was installed before it started. Ours turns it into a normal exit so that atexit hooks
    # run and the embedded PostgreSQL is stopped with the last process that uses it.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_normally)
    workers_proc = start_release_workers(release_workers)
    status = 0
    try:
        if args.workers == 1:
            # the claimed socket itself: no moment where another server could take the port
            claim.listen(2048)
            config = uvicorn.Config(
                "app.api.factory:create_server_app",
                factory=True,
                host=args.host,
                port=args.port,
                log_level=settings.log_level.lower(),
                timeout_keep_alive=settings.keepalive_s,
            )
            uvicorn.Server(config).run(sockets=[claim])
        elif reuseport_available():
            claim.close()  # each web process binds its own SO_REUSEPORT socket
            # One SO_REUSEPORT socket per web process: the kernel balances connections
            # (uvicorn's shared socket lets one process take a whole burst;
            # app/runtime/webprocs.py).
            try:
                status = run_web_processes(
                    args.host,
                    args.port,
                    args.workers,
                    settings.log_level.lower(),
                    settings.keepalive_s,
                )
            except OSError as exc:  # the port is taken, or the address is not ours
                logger.error("cannot listen on %s:%d (%s)", args.host, args.port, exc.strerror)
                status = 1
        else:
            claim.close()
            uvicorn.run(
                "app.api.factory:create_server_app",
                factory=True,
                host=args.host,
                port=args.port,
                workers=args.workers,
                log_level=settings.log_level.lower(),
                timeout_keep_alive=settings.keepalive_s,
            )
    finally:
        claim.close()
        stop_release_workers(workers_proc)
    return status


def _reconcile_bootstrap_key(url: str, settings: Settings) -> None:
    """The bootstrap key as ``DPQUANT_BOOTSTRAP_ADMIN_KEY`` says, once per ``serve``, after
    the port is bound (the web processes do not do it). Skipped, as the web processes'
    startup says, on a database that is not migrated."""
    from sqlalchemy.orm import sessionmaker

    from app.api.factory import reconcile_bootstrap_key
    from app.core.db import current_revisions, head_revisions, make_engine

    engine = make_engine(url, settings)
    try:
        if current_revisions(engine) == head_revisions():
            reconcile_bootstrap_key(sessionmaker(engine, expire_on_commit=False), settings)
    finally:
        engine.dispose()


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    """Run release workers (a supervisor and ``--concurrency`` worker processes)."""
    ensure_metrics_dir()  # before anything imports prometheus_client
    from app.core.db import resolve_database_url
    from app.runtime.worker import Supervisor

    url, _ = resolve_database_url(settings)
    concurrency = args.concurrency if args.concurrency is not None else max(1, settings.workers)
    logger.info(
        "release workers: %d process(es), run time limit %.0f s",
        concurrency,
        settings.run_timeout_s,
    )
    return Supervisor(url, settings, concurrency).run()


def admin_key_banner(settings: Settings) -> str:
    """The banner line about admin keys: whether the bootstrap key is set (never the key)."""
    if settings.bootstrap_admin_key is not None:
        return "admin key: DPQUANT_BOOTSTRAP_ADMIN_KEY is set (registered, stored hashed)"
    return (
        "admin key: DPQUANT_BOOTSTRAP_ADMIN_KEY is not set; set it before starting, or run "
        "`dpquant create-key --role admin` for a key"
    )


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Apply the Alembic migrations up to head."""
    from app.core.db import resolve_database_url, upgrade_database

    url, _ = resolve_database_url(settings)
    upgrade_database(url)
    _write("database migrated to head")
    return 0


def cmd_backup(args: argparse.Namespace, settings: Settings) -> int:
    """Dump the database (pg_dump, custom format) to a new file."""
    from app.core.db import resolve_database_url
    from app.runtime.backup import BackupError, backup

    url, _ = resolve_database_url(settings)
    try:
        done = backup(url, Path(args.path), note=args.note)
    except BackupError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    _write(
        json.dumps(
            {"path": str(done.path), "taken_at": done.taken_at.isoformat(),
             "bytes": done.size_bytes}
        )
    )  # fmt: skip
    return 0


def cmd_restore(args: argparse.Namespace, settings: Settings) -> int:
    """Restore a backup into an empty database; every budget is then held (see README)."""
    from app.core.db import resolve_database_url
    from app.runtime.backup import BackupError, restore

    url, _ = resolve_database_url(settings)
    try:
        if args.hold_only:
            from app.core.db import upgrade_database
            from app.runtime.backup import hold

            upgrade_database(url)
            since = None if args.since is None else datetime.fromisoformat(args.since)
            if since is not None and since.tzinfo is None:
                raise ValueError("no offset")
            done = hold(url, since)
        else:
            if args.path is None:
                raise BackupError("give the backup file to restore (or --hold-only)")
            done = restore(url, Path(args.path))
    except ValueError:
        sys.stderr.write("error: --since must be an ISO 8601 time with its offset\n")
        return 2
    except BackupError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    _write(
        json.dumps(
            {
                "held_since": done.held_since.isoformat(),
                "datasets_held": done.datasets_held,
                "releases_failed": done.releases_failed,
                "next": "confirm each dataset's spending since the backup: POST "
                "/v1/datasets/{id}/restore-confirmation",
            }
        )
    )
    return 0


def cmd_create_key(args: argparse.Namespace, settings: Settings) -> int:
    """Create a key and print it once."""
    from sqlalchemy.orm import Session

    from app.auth.service import create_key
    from app.core.db import make_engine, resolve_database_url, upgrade_database
    from app.core.errors import DpquantError

    url, embedded = resolve_database_url(settings)
    if embedded:
        upgrade_database(url)
    engine = make_engine(url, settings)
    try:
        with Session(engine) as session, session.begin():
            key, raw = create_key(
                session,
                role=args.role,
                dataset_id=args.dataset,
                name=args.name,
                max_epsilon=args.max_epsilon,
                max_delta=args.max_delta,
                expires_at=args.expires_at,
            )
            key_id = key.id
    except DpquantError as exc:
        sys.stderr.write(f"error: {exc.detail}\n")
        return 2
    finally:
        engine.dispose()
    sys.stderr.write(f"created {args.role} key {key_id}; it is shown only once:\n")
    _write(raw)
    return 0


def cmd_openapi(args: argparse.Namespace, settings: Settings) -> int:
    """Write the OpenAPI document (no database needed)."""
    from app.api.factory import create_app

    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_openapi(create_app(settings).openapi()))
    _write(f"wrote {out}")
    return 0


def render_openapi(document: dict[str, object]) -> str:
    """The committed, diff-friendly form of the OpenAPI document."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def cmd_experiments(argv: list[str]) -> int:
    """Forward to ``app.experiments.cli.main``."""
    try:
        from app.experiments.cli import main as experiments_main
    except ImportError as exc:
        sys.stderr.write(f"error: the experiments module is not available ({exc})\n")
        return 2
    result: int = experiments_main(argv)
    return result


def cmd_ingest(args: argparse.Namespace, settings: Settings) -> int:
    """Count a dataset's grid histogram from files and upload (cell, count) pairs only."""
    from app.ingest.command import run_ingest

    return run_ingest(args, os.environ.get("DPQUANT_API_KEY", ""))


def _budget(text: str) -> Decimal:
    """A non-negative exact decimal (argparse type)."""
    try:
        value = Decimal(text)
    except ArithmeticError:
        raise argparse.ArgumentTypeError("not a decimal number") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError("must be a finite number >= 0")
    return value


def _aware_datetime(text: str) -> datetime:
    """An ISO 8601 instant with a time zone (argparse type)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an ISO 8601 date and time") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError("give a time zone, e.g. Z or +01:00")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and the compose-file check)."""
    parser = argparse.ArgumentParser(
        prog="dpquant", description="Differentially private quantiles as a service."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API (embedded PostgreSQL if no URL is set)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="web processes (on Linux each has its own SO_REUSEPORT socket, so the kernel "
        "spreads connections over them)",
    )
    serve.add_argument(
        "--release-workers",
        type=int,
        default=None,
        help="release worker processes to start beside the API (default DPQUANT_WORKERS=2)",
    )

    worker = sub.add_parser("worker", help="run release workers (mechanism runs)")
    worker.add_argument(
        "--concurrency", type=int, default=None, help="worker processes (default DPQUANT_WORKERS)"
    )

    sub.add_parser("migrate", help="apply database migrations")

    key = sub.add_parser("create-key", help="create an API key and print it once")
    key.add_argument("--role", choices=["admin", "analyst", "viewer"], required=True)
    key.add_argument("--dataset", type=uuid.UUID, default=None, help="restrict to one dataset")
    key.add_argument("--name", default="", help="a label for humans")
    key.add_argument(
        "--max-epsilon", type=_budget, default=None, help="cap on the epsilon it may spend"
    )
    key.add_argument("--max-delta", type=_budget, default=None, help="cap on the delta")
    key.add_argument(
        "--expires-at",
        type=_aware_datetime,
        default=None,
        help="ISO 8601 instant with a time zone, e.g. 2027-03-01T00:00:00Z",
    )

    spec = sub.add_parser("openapi", help="write the OpenAPI document")
    spec.add_argument("--output", default=str(OPENAPI_PATH))

    sub.add_parser(
        "experiments", help="reproduce the paper's experiments (arguments are forwarded)"
    )

    backup = sub.add_parser(
        "backup", help="dump the database with pg_dump (custom format) to a new file"
    )
    backup.add_argument("path", help="the file to write (must not exist)")
    backup.add_argument("--note", default=None, help="a note kept with the backup's record")
    restore = sub.add_parser(
        "restore",
        help="restore a backup into an empty database; every dataset's budget is then held "
        "until an admin confirms the spending since the backup",
    )
    restore.add_argument("path", nargs="?", help="a file written by dpquant backup")
    restore.add_argument(
        "--hold-only",
        action="store_true",
        help="do not load a file: hold the budgets of a database recovered another way "
        "(point-in-time recovery) and fail its pending releases",
    )
    restore.add_argument(
        "--since", default=None, help="with --hold-only: the recovery target time (ISO 8601)"
    )

    ingest = sub.add_parser(
        "ingest",
        help="count a dataset's grid histograms from Parquet/CSV files and upload the counts "
        "(admin key in DPQUANT_API_KEY)",
    )
    ingest.add_argument("--server", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    ingest.add_argument("--dataset", required=True, help="dataset id")
    ingest.add_argument(
        "--column",
        default=None,
        help="one-column dataset: the file column to count (default: the dataset column's name)",
    )
    ingest.add_argument(
        "--columns",
        default=None,
        help="a table: its numeric columns, comma-separated, read from file columns of the "
        "same names (default: all of them; a table's columns are uploaded together)",
    )
    ingest.add_argument(
        "--unit",
        default=None,
        help="the privacy unit column of the files (default: the dataset's privacy_unit); "
        "each unit keeps at most the dataset's max_rows_per_unit rows, chosen at random here",
    )
    ingest.add_argument(
        "--missing",
        choices=["error", "skip"],
        default="error",
        help="rows with a missing value (empty cell, NA, NaN, null; Parquet null): refuse the "
        "run (default, like an upload) or skip them (counted in values_skipped)",
    )
    ingest.add_argument(
        "--group-by",
        default=None,
        help="a categorical column: also count each of its keys' histograms (after the "
        "bounding) and upload them, for grouped releases",
    )
    ingest.add_argument("--engine", choices=["local", "spark"], default="local")
    ingest.add_argument(
        "--spark-master", default="local[*]", help="Spark master URL (engine spark)"
    )
    ingest.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpquant`` console script."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "experiments":
        return cmd_experiments(args_list[1:])
    args = build_parser().parse_args(args_list)
    settings = Settings()
    configure_logging(settings.log_level)
    handlers = {
        "serve": cmd_serve,
        "worker": cmd_worker,
        "migrate": cmd_migrate,
        "create-key": cmd_create_key,
        "openapi": cmd_openapi,
        "ingest": cmd_ingest,
        "backup": cmd_backup,
        "restore": cmd_restore,
    }
    return handlers[args.command](args, settings)


if __name__ == "__main__":
    raise SystemExit(main())
