"""lark-oapi's own long-connection client (``lark_oapi.ws.Client``) against a fake, in a
process of its own (the SDK's client has no stop and one event loop per process).

    python -m tests.support.sdk_ws_client DOMAIN APP_ID APP_SECRET OUT

It appends each message event's id to OUT, and answers card actions with a toast naming the
button's value: what the fake records of it proves the fake speaks the SDK's protocol.
"""

from __future__ import annotations

import sys

import lark_oapi as lark
from lark_oapi.event.callback.model.p2_card_action_trigger import P2CardActionTriggerResponse


def main() -> None:
    domain, app_id, app_secret, out = sys.argv[1:5]

    def on_message(data: lark.im.v1.P2ImMessageReceiveV1) -> None:
        with open(out, "a") as f:
            f.write(f"{data.header.event_id}\n")

    def on_card(data: object) -> P2CardActionTriggerResponse:
        choice = data.event.action.value["choice"]  # type: ignore[attr-defined]
        return P2CardActionTriggerResponse({"toast": {"type": "info", "content": choice}})

    handler = (
        lark.EventDispatcherHandler.builder("", "")
        .register_p2_im_message_receive_v1(on_message)
        .register_p2_card_action_trigger(on_card)
        .build()
    )
    lark.ws.Client(
        app_id, app_secret, event_handler=handler, domain=domain, log_level=lark.LogLevel.DEBUG
    ).start()


if __name__ == "__main__":
    main()
