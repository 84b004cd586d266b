# feishu_inbox_enqueue() returns the stored received_at too (store/functions/
# 0022_enqueue_received_at.sql says why). PostgreSQL only; going back loads 0007's version.

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0021_card_streams'),
    ]

    operations = [
        RunPostgresFunctions(
            "0022_enqueue_received_at.sql", reverse_filename="0022_enqueue_received_at.down.sql"
        ),
    ]
