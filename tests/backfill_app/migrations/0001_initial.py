from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [("feishu_inbox", "0038_backfills")]

    operations = [
        migrations.CreateModel(
            name="Item",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("value", models.IntegerField(null=True)),
            ],
        ),
    ]
