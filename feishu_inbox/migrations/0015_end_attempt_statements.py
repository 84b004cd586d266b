# feishu_inbox_end_attempt in three statements instead of five, the same steps in the same
# order (store/functions/0015_end_attempt_statements.sql says why and what it measured).
# PostgreSQL only; going back loads 0013's version again.

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0014_row_checks'),
    ]

    operations = [
        RunPostgresFunctions(
            "0015_end_attempt_statements.sql", reverse_filename="0013_priority.sql"
        ),
    ]
