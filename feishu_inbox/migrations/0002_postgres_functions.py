"""PostgreSQL: enqueue, claim and end-of-attempt as stored functions (one round trip each).

The functions live in ``feishu_inbox/store/functions/0002_postgres_functions.sql``; a later
migration that changes them loads a later file.
"""

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):
    dependencies = [("feishu_inbox", "0001_ledger")]
    operations = [
        RunPostgresFunctions(
            "0002_postgres_functions.sql",
            reverse_filename="0002_postgres_functions.down.sql",
        )
    ]
