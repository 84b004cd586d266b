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
            # the two claims as 0039 left them, then 0040's fair claim again
            reverse_filename=("0039_fair_claims.sql", "0040_fair_ring.sql"),
        ),
    ]
