# A claim on a site without tenants reads the claimable index once: the probe for the first
# tenant walked every dead entry a held snapshot keeps there, before the claim walked them
# again. store/functions/0042_claim_without_tenants.sql says why; PostgreSQL's functions only.

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0041_ended_as_index'),
    ]

    operations = [
        RunPostgresFunctions(
            "0042_claim_without_tenants.sql",
            reverse_filename="0042_claim_without_tenants.down.sql",
        ),
    ]
