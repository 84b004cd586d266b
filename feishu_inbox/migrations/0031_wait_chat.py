# Waits (SPEC §9e): a wait records its job's chat, so that a job that gave its chat back while
# it waited (moved to a partition of its own) goes back to it when it resumes; an operator's
# cancel closes a job's open waits (cancelled).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0030_waits'),
    ]

    operations = [
        migrations.AddField(
            model_name='wait',
            name='partition_key',
            field=models.CharField(blank=True, default='', max_length=255),
        ),
        migrations.AlterField(
            model_name='wait',
            name='state',
            field=models.CharField(choices=[('open', 'open'), ('delivered', 'delivered'), ('timed_out', 'timed out'), ('cancelled', 'cancelled')], default='open', max_length=16),
        ),
    ]
