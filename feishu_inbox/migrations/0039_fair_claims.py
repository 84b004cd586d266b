# Fair claims (SPEC §9j): the partition's row carries its head's tenant, the claimable index
# leads with it, and the claim shares the slots between the tenants with due heads by their
# weights (store/functions/0039_fair_claims.sql says how; PostgreSQL's functions only, SQLite
# runs the same steps in store/sqlite.py).

from django.db import migrations, models

from feishu_inbox.store.migration import RunPostgresFunctions

# The heads that are there when it runs take their job's tenant (a head changes only where
# the new code sets it from now on).
FILL_HEAD_TENANTS = """
UPDATE feishu_inbox_partition SET head_tenant = (
    SELECT j.tenant FROM feishu_inbox_eventjob j WHERE j.id = feishu_inbox_partition.head_id
)
WHERE head_id IS NOT NULL AND EXISTS (
    SELECT 1 FROM feishu_inbox_eventjob j
    WHERE j.id = feishu_inbox_partition.head_id AND j.tenant <> ''
)
"""


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0038_backfills'),
    ]

    operations = [
        migrations.CreateModel(
            name='TenantWeight',
            fields=[
                ('tenant', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('weight', models.FloatField(default=1.0, help_text='Its share of the slots against other tenants with due work (1 is equal; 2 takes twice as many).')),
            ],
            options={
                'verbose_name': 'tenant weight',
            },
        ),
        migrations.RemoveIndex(
            model_name='partition',
            name='feishu_inbox_part_claimable',
        ),
        migrations.AddField(
            model_name='partition',
            name='head_tenant',
            field=models.CharField(blank=True, db_default='', default='', max_length=64),
        ),
        migrations.AddIndex(
            model_name='partition',
            index=models.Index(condition=models.Q(('head_state__in', ['queued', 'retry_wait'])), fields=['head_tenant', '-head_priority', 'head_id'], name='feishu_inbox_part_claimable'),
        ),
        migrations.AddIndex(
            model_name='partition',
            index=models.Index(condition=models.Q(('head_state', 'running')), fields=['head_tenant'], name='feishu_inbox_part_running'),
        ),
        migrations.AddConstraint(
            model_name='tenantweight',
            constraint=models.CheckConstraint(condition=models.Q(('weight__gt', 0), ('weight__lte', 1000)), name='feishu_inbox_tenant_weight_range'),
        ),
        migrations.RunSQL(FILL_HEAD_TENANTS, reverse_sql=migrations.RunSQL.noop),
        RunPostgresFunctions(
            "0039_fair_claims.sql",
            reverse_filename=(
                "0039_fair_claims.down.sql",
                "0015_end_attempt_statements.sql",
                "0028_finish_batch_sets.sql",
                "0029_end_attempts_by_key.sql",
                "0033_claim_by_id.sql",
                "0037_tenants.sql",
            ),
        ),
    ]
