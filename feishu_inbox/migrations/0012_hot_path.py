from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):
    dependencies = [
        ("feishu_inbox", "0011_idempotent_effects"),
    ]

    operations = [
        RunPostgresFunctions(
            "0012_hot_path.sql",
            reverse_filename=(
                "0012_hot_path.down.sql",
                "0007_cancel_and_attempts.sql",  # feishu_inbox_claim as it was
                "0011_idempotent_effects.sql",  # feishu_inbox_end_attempt as it was
            ),
        ),
        RunPostgresFunctions(
            "0012_partition_key_index.sql",
            reverse_filename="0012_partition_key_index.down.sql",
        ),
    ]
