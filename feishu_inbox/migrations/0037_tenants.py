# Tenants (SPEC §9j): every job has one ('' for none), dedupe keys are unique per tenant, and
# feishu_inbox_enqueue() stores it (store/functions/0037_tenants.sql says why; PostgreSQL
# only). The store apps' tokens and tickets are rows of feishu_inbox_app_token.

from django.db import migrations, models

from feishu_inbox.store.migration import RunPostgresFunctions, RunSQLiteSQL

# On SQLite, changing the job table's constraints rebuilds the table (a copy under the same
# name), which drops the triggers on it: 0034's member trigger is made again after the change
# (and, migrating back, after the change is undone). Its text is 0034's, frozen here.
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
DROP_MEMBER_TRIGGER = 'DROP TRIGGER IF EXISTS feishu_inbox_member_moved'


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0036_turns'),
    ]

    operations = [
        RunSQLiteSQL([], reverse_sql=[DROP_MEMBER_TRIGGER, SQLITE_MEMBER_TRIGGER]),
        migrations.AddField(
            model_name='eventjob',
            name='tenant',
            field=models.CharField(blank=True, db_default='', default='', max_length=64),
        ),
        migrations.RemoveConstraint(
            model_name='eventjob',
            name='feishu_inbox_job_dedupe',
        ),
        migrations.AddConstraint(
            model_name='eventjob',
            constraint=models.UniqueConstraint(
                fields=('app', 'dedupe_key', 'tenant'), name='feishu_inbox_job_dedupe_tenant'
            ),
        ),
        migrations.AddIndex(
            model_name='eventjob',
            index=models.Index(
                condition=models.Q(('tenant', ''), _negated=True),
                fields=['tenant', 'id'],
                name='feishu_inbox_job_tenant',
            ),
        ),
        RunSQLiteSQL([DROP_MEMBER_TRIGGER, SQLITE_MEMBER_TRIGGER], reverse_sql=[]),
        migrations.AddField(
            model_name='webhookmessage',
            name='tenant',
            field=models.CharField(blank=True, db_default='', default='', max_length=64),
        ),
        migrations.CreateModel(
            name='AppCredential',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('app', models.CharField(max_length=64)),
                ('kind', models.CharField(max_length=8)),
                ('tenant', models.CharField(blank=True, default='', max_length=64)),
                ('value', models.TextField(blank=True, default='')),
                ('expires_at', models.DateTimeField(blank=True, null=True)),
                ('issued_at', models.FloatField(blank=True, null=True)),
                ('fetching_by', models.CharField(blank=True, default='', max_length=32)),
                ('fetching_until', models.DateTimeField(blank=True, null=True)),
                ('fetches', models.PositiveIntegerField(default=0)),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'store app credential',
                'constraints': [models.UniqueConstraint(fields=('app', 'kind', 'tenant'), name='feishu_inbox_credential_once')],
            },
        ),
        RunPostgresFunctions(
            "0037_tenants.sql",
            reverse_filename=("0037_tenants.down.sql", "0025_trace_context.sql"),
        ),
    ]
