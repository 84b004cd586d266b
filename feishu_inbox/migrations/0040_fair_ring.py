# The fair claim reads a bounded ring of tenants from a cursor instead of every tenant with
# claimable heads (store/functions/0040_fair_ring.sql says why; PostgreSQL's functions only,
# SQLite ranks every due head as before).

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0039_fair_claims'),
    ]

    operations = [
        RunPostgresFunctions("0040_fair_ring.sql", reverse_filename="0039_fair_claims.sql"),
    ]
