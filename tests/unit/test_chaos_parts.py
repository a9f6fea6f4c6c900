"""The chaos harness's own parts: the store fault proxy going away from two threads at once, a harness
thread that dies, a report that says which side each finding sets against which, and the workload's
producer replaced after a transaction that ended with records unsent."""

from __future__ import annotations

import random
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chaos"))

from harness import IN_DOUBT_PER_RESTART, ChaosFailure, ThreadDeaths, left_out_bounds  # noqa: E402

import oracle  # noqa: E402
from fake_producer import AwayProducer  # noqa: E402
from store_faults import ProxyServer  # noqa: E402


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def proxy():
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    proxy = ProxyServer(upstream.server_address[1])
    yield proxy
    proxy.stop()
    upstream.shutdown()
    upstream.server_close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/bucket/key", timeout=5) as answer:
            return answer.read() == b"ok"
    except urllib.error.URLError:
        return False


def test_the_store_proxy_sent_away_by_two_threads_at_once_stops_once_and_comes_back_at_the_later_end(proxy):
    assert _answers(proxy.url)
    threads = [threading.Thread(target=proxy.away_for, args=(s,)) for s in (0.5, 1.5, 1.0, 0.5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    proxy.stop()  # a stop while away: nothing to stop
    assert not _answers(proxy.url)
    time.sleep(0.9)
    assert not _answers(proxy.url), "back at the first away's end, not the longest's"
    deadline = time.monotonic() + 10
    while not _answers(proxy.url):
        assert time.monotonic() < deadline, "the endpoint never came back"
        time.sleep(0.1)
    assert proxy.seen["away"] == 4


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the death is the point
def test_a_harness_thread_that_dies_fails_the_run_naming_it():
    with ThreadDeaths() as deaths:
        thread = threading.Thread(target=lambda: 1 / 0, name="chaos-mixed")
        thread.start()
        thread.join()
    with pytest.raises(ChaosFailure, match="chaos-mixed: ZeroDivisionError"):
        deaths.check()


def test_the_report_sets_the_table_against_kafka_apart_from_kafka_against_the_producers():
    found = oracle.Findings()
    found.add(oracle.MISSING, ("t", 0, 7), "not in the table")
    found.add(oracle.PRODUCER_LOST, ("t", 1, 3), "committed, not returned")
    found.add(oracle.PRODUCER_DIFFERS, ("t", 1, 4), "another value")
    assert found.count_of(oracle.TABLE_VS_KAFKA) == 1
    assert found.count_of(oracle.KAFKA_VS_PRODUCERS) == 2
    report = found.report()
    table, kafka = report.index(oracle.TABLE_VS_KAFKA), report.index(oracle.KAFKA_VS_PRODUCERS)
    assert table < report.index("t[0]@7") < kafka < report.index("t[1]@3")


def test_the_records_left_in_doubt_are_bounded_per_broker_restart():
    """Two transactional threads, each at most two transactions of up to 50 records per restart."""
    assert IN_DOUBT_PER_RESTART == 100
    assert left_out_bounds(16)[oracle.IN_DOUBT] == 1600 and left_out_bounds(0)[oracle.IN_DOUBT] == 100
    assert left_out_bounds(16)[oracle.QUARANTINE_AHEAD] == 100 and left_out_bounds(16)[oracle.UNPLACED] == 300


class _Journal:
    def __init__(self):
        self.ended_as: dict[str, bool] = {}

    def sent(self, topic, record, transaction):
        return lambda err, msg: None

    def ended(self, transaction, committed):
        self.ended_as[transaction] = committed


@pytest.mark.parametrize("abort", [True, False])
@pytest.mark.parametrize("unsent", [0, 3])
def test_a_transaction_that_ended_with_records_left_unsent_has_its_producer_replaced(abort, unsent):
    from offsetlake.config import KafkaSettings
    from workload import Workload

    journal = _Journal()
    workload = Workload(KafkaSettings(bootstrap_servers="127.0.0.1:1"), "t", 1, journal)
    producer = AwayProducer(unsent)
    state = {"producer": producer}

    workload._transaction(random.Random(1), state, 5, 0, abort=abort)

    assert producer.produced == 5 and list(journal.ended_as.values()) == [not abort]
    assert (state["producer"] is None) == (unsent > 0), state
    assert workload.counts["producers replaced after records left unsent"] == (1 if unsent else 0)
