# Workflows (SPEC §9f): a job's parent and the batch it counts in; the batches; the events a
# member's end writes, by a trigger on the job table (store/functions/0034_workflows.sql on
# PostgreSQL, SQLITE_MEMBER_TRIGGER below on SQLite).

from django.db import migrations, models

from feishu_inbox.store.migration import RunPostgresFunctions, RunSQLiteSQL

# SQLite's member trigger: PostgreSQL's (store/functions/0034_workflows.sql) without NOTIFY,
# which SQLite has not (its workers find the events at their next sweep).
SQLITE_MEMBER_TRIGGER = """
CREATE TRIGGER feishu_inbox_member_moved AFTER UPDATE OF status ON {job}
FOR EACH ROW
WHEN NEW.batch_id IS NOT NULL
     AND (OLD.status IN ('{completed}', '{failed}')) <> (NEW.status IN ('{completed}', '{failed}'))
BEGIN
    INSERT INTO {batch_event} (batch_id, delta)
    VALUES (NEW.batch_id,
            CASE WHEN NEW.status IN ('{completed}', '{failed}') THEN -1 ELSE 1 END);
END
"""


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0033_claim_by_id'),
    ]

    operations = [
        migrations.CreateModel(
            name='Batch',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('batch', 'batch'), ('children', 'children of a waiting parent'), ('chain', 'chain')], max_length=16)),
                ('state', models.CharField(choices=[('open', 'open'), ('closed', 'closed'), ('ready', 'ready'), ('fired', 'fired'), ('stopped', 'stopped'), ('broken', 'broken')], max_length=16)),
                ('mode', models.CharField(default='all', max_length=8)),
                ('total', models.PositiveIntegerField(default=0)),
                ('pending', models.IntegerField(default=0)),
                ('parent_id', models.BigIntegerField(blank=True, null=True)),
                ('wait_id', models.BigIntegerField(blank=True, null=True)),
                ('callbacks', models.JSONField(blank=True, default=dict)),
                ('links', models.JSONField(blank=True, default=list)),
                ('position', models.PositiveIntegerField(default=0)),
                ('length', models.PositiveIntegerField(default=0)),
                ('description', models.CharField(blank=True, default='', max_length=255)),
                ('created_at', models.DateTimeField()),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('fired_at', models.DateTimeField(blank=True, null=True)),
                ('fired_jobs', models.JSONField(blank=True, default=list)),
                ('error', models.TextField(blank=True, default='')),
            ],
            options={
                'verbose_name_plural': 'batches',
                'ordering': ['-id'],
                'permissions': [('manage_workflow', 'Can cancel a workflow or retry its failed members')],
            },
        ),
        migrations.CreateModel(
            name='BatchEvent',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('batch_id', models.BigIntegerField()),
                ('delta', models.SmallIntegerField()),
            ],
        ),
        migrations.AddField(
            model_name='eventjob',
            name='batch_id',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='eventjob',
            name='parent_id',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='eventjob',
            index=models.Index(condition=models.Q(('parent_id__isnull', False)), fields=['parent_id', 'id'], name='feishu_inbox_job_parent'),
        ),
        migrations.AddIndex(
            model_name='eventjob',
            index=models.Index(condition=models.Q(('batch_id__isnull', False)), fields=['batch_id', 'id'], name='feishu_inbox_job_batch'),
        ),
        migrations.AddIndex(
            model_name='batch',
            index=models.Index(condition=models.Q(('parent_id__isnull', False)), fields=['parent_id', 'id'], name='feishu_inbox_batch_parent'),
        ),
        migrations.AddIndex(
            model_name='batch',
            index=models.Index(condition=models.Q(('state', 'fired'), _negated=True), fields=['state', 'id'], name='feishu_inbox_batch_state'),
        ),
        migrations.AddIndex(
            model_name='batch',
            index=models.Index(condition=models.Q(('wait_id__isnull', False)), fields=['wait_id'], name='feishu_inbox_batch_wait'),
        ),
        migrations.AddIndex(
            model_name='batch',
            index=models.Index(condition=models.Q(('state', 'fired')), fields=['fired_at'], name='feishu_inbox_batch_fired'),
        ),
        RunPostgresFunctions(
            '0034_workflows.sql', reverse_filename='0034_workflows.down.sql'
        ),
        RunSQLiteSQL(
            [SQLITE_MEMBER_TRIGGER],
            reverse_sql=['DROP TRIGGER IF EXISTS feishu_inbox_member_moved'],
        ),
    ]
