# Priority (a django.tasks task's): the job carries it, its partition's row carries its head's,
# and the claim reads the claimable heads' partial index by (priority DESC, head id). The new
# columns have database defaults, so the stored functions' inserts need no change; PostgreSQL
# gets the functions that read and write them (store/functions/0013_priority.sql).

from django.db import migrations, models

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0012_hot_path'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='partition',
            name='feishu_inbox_part_claimable',
        ),
        migrations.AddField(
            model_name='eventjob',
            name='priority',
            field=models.SmallIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='partition',
            name='head_priority',
            field=models.SmallIntegerField(db_default=0, default=0),
        ),
        migrations.AddIndex(
            model_name='partition',
            index=models.Index(condition=models.Q(('head_state__in', ['queued', 'retry_wait'])), fields=['-head_priority', 'head_id'], name='feishu_inbox_part_claimable'),
        ),
        RunPostgresFunctions(
            "0013_priority.sql",
            reverse_filename=(
                "0013_priority.down.sql",
                "0012_hot_path.sql",  # end_attempt, claim and finish_together as they were
                "0010_tasks.sql",  # claim_prefixed as it was
            ),
        ),
    ]
