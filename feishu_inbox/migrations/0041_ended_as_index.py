# The admin's "ended as" filter (a turn's endings: Stale, Recalled, Stopped, Coalesced…) reads
# a partial index of the jobs that have an error type, newest first: a rare ending is found
# without walking the ledger.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0040_fair_ring'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='eventjob',
            index=models.Index(condition=models.Q(('error_type', ''), _negated=True), fields=['error_type', 'id'], name='feishu_inbox_job_error_type'),
        ),
    ]
