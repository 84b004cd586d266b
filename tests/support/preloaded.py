"""Imported once by the tests' forkserver (``tests.support.preforked``), before it forks the
commands: the libraries every ``manage.py`` command imports, and Feishu's SDK. None reads
Django's settings when imported; of the environment, only lark_oapi reads something (APP_ID and
friends, for its own samples: feishu_inbox passes credentials explicitly)."""

import django.contrib.admin
import django.core.management
import django.db.models
import django.http
import django.urls  # noqa: F401
import lark_oapi  # noqa: F401
import psycopg  # noqa: F401
