"""PostgreSQL: feishu_inbox_now_plus(seconds), the clock the shared queries read."""

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):
    dependencies = [("feishu_inbox", "0004_partition_search_index")]
    operations = [RunPostgresFunctions("0005_clock.sql", reverse_filename="0005_clock.down.sql")]
