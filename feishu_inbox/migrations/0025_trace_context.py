# Traces: a job keeps its enqueuer's trace context, and feishu_inbox_enqueue() stores it
# (store/functions/0025_trace_context.sql says why; the function is PostgreSQL only).

from django.db import migrations, models

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0024_excluded_queues'),
    ]

    operations = [
        migrations.AddField(
            model_name='eventjob',
            name='trace_parent',
            field=models.CharField(blank=True, db_default='', default='', max_length=55),
        ),
        RunPostgresFunctions(
            "0025_trace_context.sql",
            reverse_filename=("0025_trace_context.down.sql", "0022_enqueue_received_at.sql"),
        ),
    ]
