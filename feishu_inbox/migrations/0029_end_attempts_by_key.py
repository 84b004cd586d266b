# feishu_inbox_end_attempts plans its statements with enable_seqscan off: its generic plans
# scanned a small partition table whole (store/functions/0029_end_attempts_by_key.sql says
# why; PostgreSQL only).

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0028_finish_batch_sets'),
    ]

    operations = [
        RunPostgresFunctions(
            "0029_end_attempts_by_key.sql",
            reverse_filename="0029_end_attempts_by_key.down.sql",
        ),
    ]
