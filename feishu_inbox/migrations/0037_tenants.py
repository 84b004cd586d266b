# Tenants (SPEC §9j): every job has one ('' for none), dedupe keys are unique per tenant, and
# feishu_inbox_enqueue() stores it (store/functions/0037_tenants.sql says why; PostgreSQL
# only). The store apps' tokens and tickets are rows of feishu_inbox_app_token.

from django.db import migrations, models

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0035_webhooks'),
    ]

    operations = [
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
                fields=('app', 'tenant', 'dedupe_key'), name='feishu_inbox_job_dedupe_tenant'
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
