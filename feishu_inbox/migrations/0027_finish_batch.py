# A worker's batch: feishu_inbox_finish_batch, its finishes and one claim in one statement
# (store/functions/0027_finish_batch.sql says why; PostgreSQL only).

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0026_concurrency_waiters'),
    ]

    operations = [
        RunPostgresFunctions(
            "0027_finish_batch.sql", reverse_filename="0027_finish_batch.down.sql"
        ),
    ]
