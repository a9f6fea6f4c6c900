"""Topic `orders` (three partitions, made if missing) and 300 JSON orders in it, on the Kafka at
$KAFKA_BOOTSTRAP_SERVERS (default: the embedded broker of `offsetlake broker start`)."""

import json
import os

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
admin = AdminClient({"bootstrap.servers": servers})
[made] = admin.create_topics([NewTopic("orders", num_partitions=3, replication_factor=1)]).values()
try:
    made.result()
except KafkaException as err:
    if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
        raise

producer = Producer({"bootstrap.servers": servers})
for i in range(300):
    customer = ("ana", "bo", "chen")[i % 3]
    order = {"order_id": f"o{i}", "customer": customer, "amount": f"{i}.50", "placed": "2026-11-27T10:00:00Z"}
    producer.produce("orders", json.dumps(order), key=order["order_id"])
producer.flush()
print("300 orders in topic orders")
