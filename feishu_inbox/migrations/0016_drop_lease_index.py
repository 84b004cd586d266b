# The lease-expiry scan (expired_leases) reads the running jobs through feishu_inbox_job_status
# (status, id) instead: there are only as many as the workers' slots. The dropped index held
# lease_until, which every renew changes, so no renew could be a HOT update; without it a long
# job's heartbeats rewrite no index (bench: claim, two renews and a finish, 1.14 of the jobs/s).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("feishu_inbox", "0015_end_attempt_statements"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="eventjob",
            name="feishu_inbox_job_lease",
        ),
    ]
