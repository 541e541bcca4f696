"""Dockerfile and docker-compose.yml agree with each other and with the real CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from app.runtime.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def parse_cli(argv: list[str]) -> Any:
    assert argv[0] == "dpquant"
    return build_parser().parse_args(argv[1:])


def test_dockerfile_is_slim_non_root_with_healthcheck() -> None:
    instructions = dockerfile()
    base = next(rest for word, rest in instructions if word == "FROM")
    assert re.fullmatch(r"python:3\.1[1-9]-slim", base)
    user = [rest for word, rest in instructions if word == "USER"]
    assert user and user[-1] not in ("root", "0")
    health = next(rest for word, rest in instructions if word == "HEALTHCHECK")
    exposed = next(rest for word, rest in instructions if word == "EXPOSE")
    assert f"127.0.0.1:{exposed}/healthz" in health
    cmd = json.loads(next(rest for word, rest in instructions if word == "CMD"))
    args = parse_cli(cmd)
    assert args.command == "serve" and args.host == "0.0.0.0" and str(args.port) == exposed
    copied = " ".join(rest for word, rest in instructions if word == "COPY")
    for needed in ("pyproject.toml", "app", "alembic.ini"):  # app/ holds the migrations
        assert needed in copied


def test_compose_services_ports_and_commands_match_the_cli() -> None:
    services = compose()["services"]
    assert set(services) == {"db", "migrate", "app"}
    db = services["db"]
    assert db["image"] == "postgres:16"
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])

    migrate = parse_cli(services["migrate"]["command"])
    assert migrate.command == "migrate"
    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"

    app = services["app"]
    serve = parse_cli(app["command"])
    assert serve.command == "serve" and serve.host == "0.0.0.0"
    _, container_port = app["ports"][0].split(":")
    assert int(container_port) == serve.port
    assert app["depends_on"]["db"]["condition"] == "service_healthy"
    assert app["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name in ("migrate", "app"):
        url = services[name]["environment"]["DPQUANT_DATABASE_URL"]
        assert url.startswith("postgresql+psycopg://") and "@db:5432/" in url
    assert "DPQUANT_BOOTSTRAP_ADMIN_KEY" in app["environment"]


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".venv", ".dpquant", ".git"):
        assert entry in ignored


def test_a_built_wheel_carries_the_migrations_and_the_canonical_sql(tmp_path: Path) -> None:
    """A plain ``pip install`` of the wheel can migrate: the Alembic environment, every
    revision and the reservation's canonical SQL are package data."""
    import subprocess
    import sys
    import zipfile

    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(root),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("dpquant-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    revisions = sorted(p.name for p in (root / "app/migrations/versions").glob("*.py"))
    assert revisions and "app/migrations/env.py" in names
    assert "app/migrations/script.py.mako" in names
    assert {f"app/migrations/versions/{r}" for r in revisions} <= names
    assert "app/releases/sql/release_reserve.sql" in names
