# A django.tasks backend on the ledger (feishu_inbox/tasks.py): tasks are jobs, so no table
# changes; PostgreSQL gets the claim of a worker that runs some task queues only.

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0009_schedules'),
    ]

    operations = [
        RunPostgresFunctions("0010_tasks.sql", reverse_filename="0010_tasks.down.sql"),
    ]
