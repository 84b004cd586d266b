"""The tenants' weights page (SPEC §9j, fair claims): an operator with the permission sets a
tenant's weight and the next claims use it; a weight out of range is refused with why and
stores nothing; without the permission the page refuses."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from feishu_inbox import ledger
from feishu_inbox.tables.tenants import TenantWeight
from tests.ledger.test_fair_claims import flood, tenants_of

pytestmark = pytest.mark.django_db(transaction=True)


def operator(*codenames: str) -> Client:
    user = User.objects.create_user("op-" + "-".join(codenames or ("none",)), is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def test_an_operator_sets_a_weight_and_the_next_claims_use_it() -> None:
    add = reverse("admin:feishu_inbox_tenantweight_add")
    viewer = operator("view_tenantweight")
    assert viewer.post(add, {"tenant": "a", "weight": "3"}).status_code == 403
    editor = operator("view_tenantweight", "add_tenantweight", "change_tenantweight")
    for bad in ("0", "-1", "5000", "many"):
        page = editor.post(add, {"tenant": "a", "weight": bad})
        assert page.status_code == 200 and "errorlist" in page.content.decode(), bad
    assert not TenantWeight.objects.exists()
    answer = editor.post(add, {"tenant": "a", "weight": "3"})
    assert answer.status_code == 302
    assert TenantWeight.objects.get(tenant="a").weight == 3
    flood("a", 10, 2)
    flood("b", 10, 2)
    assert tenants_of(ledger.claim("w1", limit=8)) == {"a": 6, "b": 2}
