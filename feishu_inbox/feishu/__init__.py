"""The Feishu half: events in, replies out.

- ``protocol``: a delivery verified, decrypted and decoded (signature, replay window, challenge,
  token), the event's keys (dedupe, partition, private), card callbacks;
- ``webhook``: the view that stores a delivery through ``ledger.enqueue`` and answers Feishu;
- ``openapi``: Feishu's Open API through the official SDK, its answers as typed errors;
- ``replies``: ``reply``/``send``/``client``, the message calls as idempotent effects.

A new Feishu API call goes in ``openapi`` (the request, its answers as errors) and, when a
handler makes it, beside ``reply`` in ``replies`` as an effect.
"""
