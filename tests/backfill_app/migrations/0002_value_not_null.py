from django.db import migrations, models

from feishu_inbox.backfills import RequireBackfill


class Migration(migrations.Migration):
    dependencies = [("backfill_app", "0001_initial")]

    operations = [
        RequireBackfill("gate.fill_value"),
        migrations.AlterField(model_name="item", name="value", field=models.IntegerField()),
    ]
