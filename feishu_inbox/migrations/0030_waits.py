# Waits (SPEC §9e): a job may be `waiting` (no lease, no slot), its waits memoized in
# feishu_inbox_wait, signals sent before their waiter kept in feishu_inbox_signal. The job's
# status CHECK takes the new state: a CHECK constraint on SQLite, the row trigger on
# PostgreSQL (store/functions/0030_waits.sql), as migration 0014 split them.

import django.db.models.deletion
from django.db import migrations, models

from feishu_inbox.store.migration import (
    AddConstraintOffPostgres,
    RemoveConstraintOffPostgres,
    RunPostgresFunctions,
)


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0029_end_attempts_by_key'),
    ]

    operations = [
        migrations.CreateModel(
            name='Signal',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=255)),
                ('payload', models.JSONField(blank=True, null=True)),
                ('sent_at', models.DateTimeField()),
                ('expires_at', models.DateTimeField()),
            ],
            options={
                'ordering': ['id'],
            },
        ),
        migrations.CreateModel(
            name='Wait',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=128)),
                ('key', models.CharField(blank=True, default='', max_length=255)),
                ('until', models.DateTimeField(blank=True, null=True)),
                ('state', models.CharField(choices=[('open', 'open'), ('delivered', 'delivered'), ('timed_out', 'timed out')], default='open', max_length=16)),
                ('hold_chat', models.BooleanField(default=True)),
                ('payload', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('resolved_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'ordering': ['job_id', 'id'],
                'permissions': [('signal_wait', 'Can signal or time out waiting jobs')],
            },
        ),
        RemoveConstraintOffPostgres(
            model_name='eventjob',
            name='feishu_inbox_job_status_valid',
        ),
        migrations.AlterField(
            model_name='attempt',
            name='outcome',
            field=models.CharField(choices=[('queued', 'queued'), ('running', 'running'), ('retry_wait', 'retry wait'), ('completed', 'completed'), ('failed', 'failed'), ('unknown', 'unknown'), ('waiting', 'waiting')], max_length=16),
        ),
        migrations.AlterField(
            model_name='eventjob',
            name='status',
            field=models.CharField(choices=[('queued', 'queued'), ('running', 'running'), ('retry_wait', 'retry wait'), ('completed', 'completed'), ('failed', 'failed'), ('unknown', 'unknown'), ('waiting', 'waiting')], default='queued', max_length=16),
        ),
        migrations.AlterField(
            model_name='partition',
            name='head_state',
            field=models.CharField(choices=[('idle', 'idle'), ('queued', 'queued'), ('running', 'running'), ('retry_wait', 'retry wait'), ('failed', 'failed'), ('unknown', 'unknown'), ('waiting', 'waiting')], default='idle', max_length=16),
        ),
        AddConstraintOffPostgres(
            model_name='eventjob',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['queued', 'running', 'retry_wait', 'completed', 'failed', 'unknown', 'waiting'])), name='feishu_inbox_job_status_valid'),
        ),
        migrations.AddIndex(
            model_name='signal',
            index=models.Index(fields=['key', 'id'], name='feishu_inbox_signal_key'),
        ),
        migrations.AddField(
            model_name='wait',
            name='job',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='waits', to='feishu_inbox.eventjob'),
        ),
        migrations.AddIndex(
            model_name='wait',
            index=models.Index(condition=models.Q(('state', 'open')), fields=['key'], name='feishu_inbox_wait_key'),
        ),
        migrations.AddIndex(
            model_name='wait',
            index=models.Index(condition=models.Q(('state', 'open')), fields=['until'], name='feishu_inbox_wait_due'),
        ),
        migrations.AddConstraint(
            model_name='wait',
            constraint=models.UniqueConstraint(fields=('job', 'name'), name='feishu_inbox_wait_once'),
        ),
        RunPostgresFunctions("0030_waits.sql", reverse_filename="0030_waits.down.sql"),
    ]
