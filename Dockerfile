# dpquant API image: slim Python, non-root user, health check on /healthz.
# Build: docker build -t dpquant .   Run with docker-compose.yml (PostgreSQL 16 + migrations).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
RUN pip install . \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin dpquant \
    && chown -R dpquant:dpquant /app

USER dpquant
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status == 200 else 1)"]

CMD ["dpquant", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
