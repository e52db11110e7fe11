"""An application script written for the native PyPI `rocketmq` binding (0.4.x API), as its
users wrote them. tests/compat/test_client_compat.py runs it twice: as it is, and with its one
import line changed to `from client.compat import ...`; nothing else differs.

    python native_api_script.py NAMESRV TOPIC GROUP

It sends 20 messages with send_sync, 10 with send_orderly over 2 keys and 5 with send_oneway,
then consumes them with a push consumer, and prints one JSON line of what it saw.
"""

import json
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer, SendStatus

NAMESRV, TOPIC, GROUP = sys.argv[1], sys.argv[2], sys.argv[3]
TIMEOUT_S = 60

producer = Producer("native_script_pg")
producer.set_namesrv_addr(NAMESRV)
producer.start()
statuses = []


def resending(send, *args):
    """librocketmq 0.4.4 sometimes fails a send before it reaches any broker (its transport
    table lock timed out: "No route info of this topic"); its users resend those."""
    for _ in range(3):
        try:
            return send(*args)
        except Exception as err:
            if "No route info" not in str(err):
                raise
            time.sleep(0.2)
    return send(*args)


for i in range(20):
    msg = Message(TOPIC)
    msg.set_keys(f"key-{i}")
    msg.set_tags("TagA" if i % 2 else "TagB")
    msg.set_property("seq", str(i))
    msg.set_body(f"sync-{i}")
    result = resending(producer.send_sync, msg)
    statuses.append(result.status == SendStatus.OK)
for i in range(10):
    msg = Message(TOPIC)
    msg.set_keys(f"okey-{i}")
    msg.set_tags("TagO")
    msg.set_property("seq", str(100 + i))
    msg.set_body(f"orderly-{i}")
    result = resending(producer.send_orderly, msg, i % 2)
    statuses.append(result.status == SendStatus.OK)
for i in range(5):
    msg = Message(TOPIC)
    msg.set_tags("TagW")
    msg.set_property("seq", str(200 + i))
    msg.set_body(f"oneway-{i}")
    resending(producer.send_oneway, msg)
producer.shutdown()

received = {}
lock = threading.Lock()


def callback(msg):
    with lock:
        received[msg.body.decode()] = {
            "tags": msg.tags.decode() if isinstance(msg.tags, bytes) else msg.tags,
            "keys": msg.keys.decode() if isinstance(msg.keys, bytes) else msg.keys,
            "seq": msg.get_property("seq"),
            "topic": msg.topic.decode() if isinstance(msg.topic, bytes) else msg.topic,
        }


consumer = PushConsumer(GROUP)
consumer.set_namesrv_addr(NAMESRV)
consumer.subscribe(TOPIC, callback)
consumer.start()
deadline = time.time() + TIMEOUT_S
while time.time() < deadline:
    with lock:
        if len(received) >= 35:
            break
    time.sleep(0.1)
consumer.shutdown()
with lock:
    seen = dict(received)
for value in seen.values():
    if isinstance(value["seq"], bytes):
        value["seq"] = value["seq"].decode()
print(json.dumps({"sent_ok": statuses, "received": seen}, sort_keys=True), flush=True)
