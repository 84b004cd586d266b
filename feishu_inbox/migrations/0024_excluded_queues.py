# runworker --exclude-queues: the prefixed claim and finish_together take p_excluding
# (store/functions/0024_excluded_queues.sql says why; PostgreSQL only), and a worker's
# heartbeat row names the queues it leaves out.

from django.db import migrations, models

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0023_worker_beats'),
    ]

    operations = [
        migrations.AddField(
            model_name='workerbeat',
            name='excluded_queues',
            # db_default: a worker of the version before (a rolling deploy) inserts its row
            # without the column
            field=models.CharField(blank=True, db_default='', default='', max_length=255),
        ),
        RunPostgresFunctions(
            "0024_excluded_queues.sql", reverse_filename="0024_excluded_queues.down.sql"
        ),
    ]
