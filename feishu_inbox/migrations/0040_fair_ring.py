# The fair claim reads a bounded ring of tenants from a cursor instead of every tenant with
# claimable heads, where every weight is 1 and every claimable head has priority 0 (the new
# partial index holds the heads of another priority). store/functions/0040_fair_ring.sql
# says why; PostgreSQL's functions only (SQLite ranks every due head, as before).

from django.db import migrations, models

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0039_fair_claims'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='partition',
            index=models.Index(condition=models.Q(('head_state__in', ['queued', 'retry_wait']), models.Q(('head_priority', 0), _negated=True)), fields=['head_priority'], name='feishu_inbox_part_ranked'),
        ),
        RunPostgresFunctions("0040_fair_ring.sql", reverse_filename="0039_fair_claims.sql"),
    ]
