# A batch's finishes as sets: feishu_inbox_finish_batch ends its jobs through the new
# feishu_inbox_end_attempts, three statements whatever their number, generic plans
# (store/functions/0028_finish_batch_sets.sql says why; PostgreSQL only).

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0027_finish_batch'),
    ]

    operations = [
        RunPostgresFunctions(
            "0028_finish_batch_sets.sql",
            reverse_filename=("0028_finish_batch_sets.down.sql", "0027_finish_batch.sql"),
        ),
    ]
