"""`offsetlake produce` (offsetlake_local.producer.produce) after a transaction whose flush left records unsent.

Fast unit test: confluent-kafka's producers are replaced by `fake_producer.AwayProducer`.
"""

import pytest

from fake_producer import AwayProducer
from offsetlake.config import KafkaSettings
from offsetlake_local import producer


class _Idempotent(AwayProducer):
    def __init__(self, settings):
        super().__init__(0)


@pytest.mark.parametrize("unsent", [0, 3])
def test_a_producer_whose_aborted_transaction_left_records_unsent_is_not_used_again(monkeypatch, unsent):
    made: list[tuple[str, AwayProducer]] = []

    def transactional_producer(settings, transactional_id, **extra):
        made.append((transactional_id, AwayProducer(unsent if not made else 0)))
        return made[-1][1]

    monkeypatch.setattr(producer, "Producer", _Idempotent)
    monkeypatch.setattr(producer, "transactional_producer", transactional_producer)

    report = producer.produce(
        KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        "t",
        40,
        transactional_share=1.0,
        abort_share=0.5,
        transaction_size=10,
        seed=4,
    )

    first = made[0][1]
    assert first.ended[0] == "abort" and report.aborted_transactions >= 1  # the seed aborts the first one
    if unsent:
        assert first.ended == ["abort"], "the producer was used again after its abort purged unsent records"
        assert len({name for name, _ in made}) == len(made) > 1  # each under a transactional id of its own
    else:
        assert len(made) == 1 and len(first.ended) == report.transactions
