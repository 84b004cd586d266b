# The claim updates its jobs by primary key (store/functions/0033_claim_by_id.sql): with many
# jobs that are not claimable (waiting, or completed) the planner served the old join from the
# status index and read every queued job on each claim. PostgreSQL only.

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0032_wait_ask'),
    ]

    operations = [
        RunPostgresFunctions("0033_claim_by_id.sql", reverse_filename="0033_claim_by_id.down.sql"),
    ]
