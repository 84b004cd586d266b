"""The Feishu half: events in, replies out.

- ``protocol``: a delivery verified, decrypted and decoded (signature, replay window, challenge,
  token), the event's keys (dedupe, partition, private), card callbacks;
- ``webhook``: the view that stores a delivery through ``ledger.enqueue`` and answers Feishu;
- ``inbound``: what the webhook and the long connection both do with a decoded event;
- ``deliveries``: deliveries built as Feishu builds them (``inbox send-test-event``);
- the long connection: ``gateway`` (the ``feishu_connect`` process: one channel per app, their
  reports, a probe), ``channel`` (one app's connection: each event stored before its ACK),
  ``fragments`` (messages split over frames, joined) and ``frames`` (the frame codec);
- ``openapi``: Feishu's Open API through the official SDK, its answers as typed errors;
  ``tenancy``: store (ISV) apps, their app ticket and a token per tenant;
- ``replies``: ``reply``/``send``/``client``, the message calls as idempotent effects;
- ``cardkit``: the CardKit calls a streamed card is made of (create, stream, settings, update);
- ``streams``: ``stream_reply``/``stream_send``, an answer streamed into one card, resumed
  after a crash (its state in ``ledger/streams.py``);
- ``asks``: ``ask``, a question in a card with a button per choice, a durable wait for the
  click (its wait in ``ledger/waits.py``); ``questions``: the click, decided under the
  question's key before the webhook or the long connection answers it;
- ``turns``: conversation turns on Feishu: messages and recalls read from events, ``typing``
  (a reaction removed once the turn ends), the stop button, the reaction cleanup kind.

A new Feishu API call goes in ``openapi`` (the request, its answers as errors) and, when a
handler makes it, beside ``reply`` in ``replies`` as an effect.
"""
