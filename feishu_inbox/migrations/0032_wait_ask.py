# Card questions (feishu_inbox.ask, SPEC §9e): a wait carries its question's rule (the
# choices and who may answer), which the card callback reads under the key's lock, and a
# question is found by its key whatever its state (a second or late click).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('feishu_inbox', '0031_wait_chat'),
    ]

    operations = [
        migrations.AddField(
            model_name='wait',
            name='ask',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='wait',
            index=models.Index(condition=models.Q(('ask__isnull', False)), fields=['key'], name='feishu_inbox_wait_question'),
        ),
    ]
