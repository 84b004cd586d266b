# On PostgreSQL the job's and the partition's CHECK constraints become row triggers that check
# the same conditions and fail the same way (check_violation: IntegrityError), because
# PostgreSQL parses and plans every CHECK again for each statement that writes the table,
# about a fifth of its CPU per job (store/functions/0014_row_checks.sql says how it was
# measured). Django's state keeps the constraints, which SQLite still enforces as CHECKs and
# Model.validate_constraints still evaluates in Python.

from django.db import migrations

from feishu_inbox.store.migration import RunPostgresFunctions


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0013_priority'),
    ]

    operations = [
        RunPostgresFunctions(
            "0014_row_checks.sql", reverse_filename="0014_row_checks.down.sql"
        ),
    ]
