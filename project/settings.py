"""Settings of the feishu_inbox demo project, read from the environment (django-environ).

DATABASE_URL   default: a SQLite file next to manage.py (WAL, IMMEDIATE transactions)
STATIC_ROOT    where `collectstatic` puts the admin's static files (default: staticfiles/)
DEBUG, SECRET_KEY, ALLOWED_HOSTS
FEISHU_ENCRYPT_KEY, FEISHU_VERIFICATION_TOKEN   the default Feishu app's secrets
FEISHU_APP_ID, FEISHU_APP_SECRET, FEISHU_DOMAIN  its Open API credentials and domain (to reply)
FEISHU_APP_TYPE   "store" for a store (ISV) app; FEISHU_INBOX_STORE_TOKEN_MARGIN its tokens' margin
FEISHU_INBOX_TENANT_REQUIRED   refuse jobs that declare no tenant
FEISHU_INBOX_HANDLERS   comma-separated dotted paths of handler modules
FEISHU_INBOX_METRICS_TOKEN, FEISHU_INBOX_METRICS_ALLOW   who may read /feishu/metrics/
FEISHU_INBOX_TRANSACTION_POOLER, FEISHU_INBOX_LISTEN_URL, FEISHU_INBOX_POLL_ONLY   behind
               PgBouncer in transaction mode (docs/production.md, "PostgreSQL topology")
"""

from __future__ import annotations

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
# .env (see .env.example) holds the demo's secrets for every command run here; the real
# environment wins. `make test` sets FEISHU_INBOX_READ_DOTENV=0: a developer's .env must not
# change what the suite runs with.
if env.bool("FEISHU_INBOX_READ_DOTENV", default=True):
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="insecure-demo-key-set-SECRET_KEY-in-production")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "feishu_inbox",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves STATIC_ROOT (filled by `collectstatic`, which `rundemo` runs) under gunicorn with
    # DEBUG off: the admin's CSS and JS. Placed before everything but SecurityMiddleware.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A web process and a worker share the file: WAL lets readers run beside the writer,
    # IMMEDIATE takes the write lock at BEGIN (no lock-upgrade deadlocks), and the busy
    # timeout makes a writer wait its turn instead of failing.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": env.float("SQLITE_BUSY_TIMEOUT", default=20.0),
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["TEST"] = {
        "NAME": env.str("SQLITE_TEST_NAME", default=str(BASE_DIR / "test-db.sqlite3"))
    }
# Persistent connections: opening one per request costs more than the webhook's own work
# (on SQLite it also re-runs the PRAGMAs); health checks replace a connection that died.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=300)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Behind PgBouncer in transaction mode (docs/production.md, "PostgreSQL topology"): no
# server-side cursors, no prepared statements; wake-ups on a direct LISTEN_URL, or polling.
POOLED = env.bool("FEISHU_INBOX_TRANSACTION_POOLER", default=False)
if POOLED:
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # collectstatic also writes a gzip copy of each file; WhiteNoise sends it to clients
    # that accept it. (No manifest: pages render the same whether or not collectstatic ran.)
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

FEISHU_INBOX: dict[str, object] = {
    "HANDLER_MODULES": env.list("FEISHU_INBOX_HANDLERS", default=[]),
    "MAX_ATTEMPTS": env.int("FEISHU_INBOX_MAX_ATTEMPTS", default=5),
    "BACKOFF_BASE": env.float("FEISHU_INBOX_BACKOFF_BASE", default=5.0),
    "LEASE_SECONDS": env.float("FEISHU_INBOX_LEASE_SECONDS", default=60.0),
    "POLL_INTERVAL": env.float("FEISHU_INBOX_POLL_INTERVAL", default=1.0),
    "TRANSACTION_POOLER": POOLED,
    "PREPARE_STATEMENTS": env.bool("FEISHU_INBOX_PREPARE_STATEMENTS", default=True),
    "LISTEN_URL": env.str("FEISHU_INBOX_LISTEN_URL", default=""),
    "POLL_ONLY": env.bool("FEISHU_INBOX_POLL_ONLY", default=False),
    "BATCH_WINDOW": env.float("FEISHU_INBOX_BATCH_WINDOW", default=0.005),
    "PURGE_INTERVAL": env.float("FEISHU_INBOX_PURGE_INTERVAL", default=300.0),
    # Who may read /feishu/metrics/ besides staff (README "Monitoring").
    "TENANT_REQUIRED": env.bool("FEISHU_INBOX_TENANT_REQUIRED", default=False),
    "STORE_TOKEN_MARGIN_SECONDS": env.float("FEISHU_INBOX_STORE_TOKEN_MARGIN", default=600.0),
    "METRICS_TOKEN": env.str("FEISHU_INBOX_METRICS_TOKEN", default=""),
    "METRICS_ALLOW": env.list("FEISHU_INBOX_METRICS_ALLOW", default=[]),
    # The demo's schedule: its task every five minutes (the admin's Schedules page). On with
    # DEMO_SCHEDULES=1 (make demo, .env.example); off for the test suite, whose workers must
    # run only the jobs each test enqueues.
    "SCHEDULES": (
        {"reply-tally": {"cron": "*/5 * * * *", "handler": "project.demo.tasks.tally_replies"}}
        if env.bool("DEMO_SCHEDULES", default=False)
        else {}
    ),
    "APPS": {
        "default": {
            "ENCRYPT_KEY": env.str("FEISHU_ENCRYPT_KEY", default=""),
            "VERIFICATION_TOKEN": env.str("FEISHU_VERIFICATION_TOKEN", default=""),
            # Replying through the Open API (unset: the demo bot does not call Feishu).
            "APP_ID": env.str("FEISHU_APP_ID", default=""),
            "APP_SECRET": env.str("FEISHU_APP_SECRET", default=""),
            "DOMAIN": env.str("FEISHU_DOMAIN", default="feishu"),
            # "store" for a store (ISV) app: a token per tenant (docs/tenants.md).
            "APP_TYPE": env.str("FEISHU_APP_TYPE", default="self_built"),
        },
    },
}

# Background tasks on the ledger (README "Background tasks"): Django 6's django.tasks, or the
# django-tasks backport on Django 5.2 (the `tasks` extra).
TASKS = {
    "default": {
        "BACKEND": "feishu_inbox.tasks.LedgerBackend",
        "QUEUES": ["default", "emails"],
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "feishu_inbox": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
        # A 500 (an unexpected exception in a view) with its traceback: with DEBUG off Django
        # sends it to no handler of its own. Refusals (4xx) are feishu_inbox.webhook's lines.
        "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
    },
}
