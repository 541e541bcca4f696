"""Service configuration: one ``Settings`` class read from ``DPQUANT_*`` environment variables."""

from __future__ import annotations

from decimal import Decimal
from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Words of a value someone forgot to replace ("change-me-to-a-long-random-secret"):
#: a secret that contains one (case and separators ignored) is refused. Each has at least
#: 7 letters, so a random url-safe secret of 43 characters contains a given one with
#: probability below 37 * 37^-7 < 10^-9.
PLACEHOLDER_WORDS = (
    "changeme",
    "changethis",
    "replaceme",
    "yoursecret",
    "yourtoken",
    "placeholder",
    "example",
    "password",
    "secretkey",
    "xxxxxxx",
)
#: A random secret of 32 url-safe characters has ~25 distinct ones; fewer than this many
#: marks a repeated or typed pattern ("aaaa...", "0123456789" * 4).
MIN_DISTINCT_CHARACTERS = 12

#: Minimum length of a bootstrap admin key (43 url-safe characters carry 256 bits).
MIN_BOOTSTRAP_KEY_LENGTH = 32


class Settings(BaseSettings):
    """Every tunable of the service; each field is read from ``DPQUANT_<FIELD>``.

    Limits live here so that hardening can tighten them without touching the services.
    """

    model_config = SettingsConfigDict(env_prefix="DPQUANT_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy/libpq URL of PostgreSQL; unset = embedded PostgreSQL (pgserver).",
    )
    data_dir: Path = Field(
        default=Path(".dpquant"), description="Directory of the embedded PostgreSQL data."
    )
    bootstrap_admin_key: SecretStr | None = Field(
        default=None, description="If set, this key is accepted as an admin key (stored hashed)."
    )
    log_level: str = Field(default="INFO", description="Python logging level.")
    oidc_issuer: str | None = Field(
        default=None,
        description="OpenID Connect issuer URL: bearer tokens it signs are accepted beside API "
        "keys (discovery at {issuer}/.well-known/openid-configuration); unset = keys only.",
    )
    oidc_audience: str | None = Field(
        default=None, description="The audience (aud) tokens must name (required with an issuer)."
    )
    oidc_jwks_url: str | None = Field(
        default=None, description="The issuer's JWKS URL (overrides discovery)."
    )
    oidc_role_claim: str = Field(
        default="dpquant_role", description="The claim holding admin, analyst or viewer."
    )
    oidc_datasets_claim: str = Field(
        default="dpquant_datasets",
        description="The claim listing the dataset ids a token is scoped to (absent: unscoped, "
        "admins only).",
    )
    oidc_jwks_refresh_s: float = Field(
        default=10.0,
        ge=0,
        description="A token signed by an unknown key id refetches the JWKS at most this often.",
    )
    otel_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP endpoint for OpenTelemetry traces (e.g. "
        "http://collector:4318/v1/traces); unset = no tracing, at no cost.",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="Bearer token that may read /metrics besides admin keys (>= 32 chars).",
    )

    # Limits.
    max_upload_bytes: int = Field(
        default=4 * 1024**3,
        gt=0,
        description="Largest values or histogram upload (bytes); streamed, constant memory.",
    )
    max_values: int = Field(
        default=10**9,
        gt=0,
        le=2**53,
        description="Most values per dataset (all appends together); at most 2^53, the "
        "largest count every computation holds exactly.",
    )
    max_cells: int = Field(default=10**7, gt=0, description="Most distinct grid cells per dataset.")
    max_quantiles: int = Field(default=1000, gt=0, description="Most quantiles per query.")
    max_body_bytes: int = Field(
        default=1024 * 1024, gt=0, description="Largest request body except value uploads."
    )
    max_page_size: int = Field(default=500, gt=0, description="Largest `limit` of list pages.")
    values_cache_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        description="Per-process cache of loaded dataset values (bytes; 0 = off).",
    )
    min_release_ms: int = Field(
        default=0, ge=0, description="Pad release responses to at least this many ms (0 = off)."
    )
    rate_limit_per_minute: int = Field(
        default=0, ge=0, description="Requests per minute per API key, per process (0 = off)."
    )
    rate_limit_burst: int = Field(
        default=0, ge=0, description="Burst size of the per-key rate limit (0 = one minute's)."
    )
    min_epsilon: Decimal = Field(
        default=Decimal("0.001"),
        ge=0,
        description="Smallest epsilon a release may spend (422 below). A release below it "
        "costs next to nothing yet takes a worker's time, so without a floor one key can queue "
        "runs without end. At 0.001 a budget of 1 pays for at most 1,000 releases. "
        "What it takes from analysts: one quantile by the exponential mechanism misses by "
        "~2 ln(d) / epsilon ranks at best, so an epsilon below 0.001 misses by more than "
        "~28,000 ranks on 10^6 distinct values (over 2 % of n = 10^6; pure noise on smaller "
        "data); only datasets of ~10^7 values and more lose a useful range, and their admins "
        "can lower the floor. 0 turns it off.",
    )
    max_pending_per_key: int = Field(
        default=64,
        ge=0,
        description="Most releases one key may have waiting to run (429 too_many_pending "
        "above; 0 = no cap). With the workers taking one run of each key and dataset in turn, "
        "a key's backlog delays another's release by at most one run; the cap bounds the "
        "queue itself (each pending release is a row every claim ranks).",
    )
    max_pending_per_dataset: int = Field(
        default=256,
        ge=0,
        description="Most releases one dataset may have waiting to run, all keys together "
        "(429 too_many_pending above; 0 = no cap).",
    )
    auth_failures_per_minute: int = Field(
        default=300,
        ge=0,
        description="Failed authentications per minute per client address, per process, before "
        "further unknown keys from it get 429 without a database lookup (0 = off).",
    )

    # HTTP.
    keepalive_s: int = Field(
        default=75,
        gt=0,
        description=(
            "Seconds an idle HTTP keep-alive connection stays open. Above the dashboard's"
            " 5 s poll and the usual 60 s idle timeout of load balancers, so that the server"
            " never closes a connection just as a client reuses it."
        ),
    )

    # Database pool.
    pool_size: int = Field(default=10, gt=0, description="Connections kept per process.")
    max_overflow: int = Field(default=20, ge=0, description="Extra connections under load.")
    pool_timeout_s: float = Field(default=30.0, gt=0, description="Wait for a free connection.")
    connect_timeout_s: int = Field(default=5, gt=0, description="PostgreSQL connect timeout.")
    statement_timeout_ms: int = Field(
        default=60_000,
        ge=0,
        description="Longest statement or lock wait before a 503 (0 = unbounded).",
    )

    # Release workers.
    workers: int = Field(
        default=2,
        ge=0,
        description="Release worker processes `dpquant serve` starts beside the API (0 = none).",
    )
    run_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="Hard time limit of one mechanism run; past it the release is failed.",
    )
    lease_margin_s: float = Field(
        default=30.0,
        gt=0,
        description="A worker's lease on a release lasts run_timeout_s plus this margin.",
    )
    max_runs: int = Field(
        default=3, ge=1, description="Mechanism runs one release may start in all (retries)."
    )
    sync_wait_s: float = Field(
        default=150.0,
        ge=0,
        description="How long a synchronous query waits for its run before answering 202.",
    )
    publish_scale: float = Field(
        default=1.0,
        ge=0,
        description="Scale of the public run-time bound that decides when a release is "
        "published (app.releases.schedule): non-admin readers see a release at its run's "
        "start plus the bound, never its finish time, and a worker starts its next run only "
        "then. Raise it on slower machines (docs/security.md measures how often "
        "runs outlive the bound); 0 turns publication times off.",
    )
    worker_poll_s: float = Field(
        default=1.0, gt=0, description="Idle workers look for runnable releases this often."
    )
    chaos_run_delay_ms: int = Field(
        default=0,
        ge=0,
        description="Fault injection for tests: workers sleep this long before each run.",
    )

    @field_validator("bootstrap_admin_key", "metrics_token")
    @classmethod
    def _refuse_placeholder(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        raw = value.get_secret_value()
        letters = "".join(ch for ch in raw.lower() if ch.isalnum())
        if (
            len(raw) < MIN_BOOTSTRAP_KEY_LENGTH
            or len(set(raw)) < MIN_DISTINCT_CHARACTERS
            or any(word in letters for word in PLACEHOLDER_WORDS)
        ):
            raise ValueError(
                f"must be a random secret of at least {MIN_BOOTSTRAP_KEY_LENGTH} characters "
                "(e.g. secrets.token_urlsafe(32) in Python, or openssl rand -base64 32)"
            )
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
