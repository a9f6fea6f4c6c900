"""spans_together: a refused run halved around its bad records, the rest taken together."""

from offsetlake.formats.halving import Span, spans_together


def taking_unless(bad: set[int], calls: list[tuple[int, int]]):
    def together(start: int, length: int):
        calls.append((start, length))
        return None if bad & set(range(start, start + length)) else f"{start}+{length}"

    return together


def test_a_run_without_bad_records_is_taken_in_one_call():
    calls: list[tuple[int, int]] = []
    assert spans_together(10, 100, taking_unless(set(), calls), least=4) == [Span(10, 100, "10+100")]
    assert calls == [(10, 100)]


def test_a_refused_run_is_halved_until_the_part_around_each_bad_record_is_below_twice_least():
    calls: list[tuple[int, int]] = []
    spans = spans_together(0, 64, taking_unless({5, 40}, calls), least=4)
    # 64 -> 0-31 -> 0-15 -> 0-7 -> (0-3 taken, 4-7 left); 8-15, 16-31 taken; 32-63 -> 32-47 -> 32-39 taken,
    # 40-47 -> (40-43 left, 44-47 taken); 48-63 taken
    expected = [(0, 4), (4, 4), (8, 8), (16, 16), (32, 8), (40, 4), (44, 4), (48, 16)]
    assert [(s.start, s.length) for s in spans] == expected
    left = [s for s in spans if s.taken is None]
    assert [(s.start, s.length) for s in left] == [(4, 4), (40, 4)]
    assert all(s.taken == f"{s.start}+{s.length}" for s in spans if s.taken is not None)


def test_an_odd_run_is_covered_without_gaps_or_overlaps():
    spans = spans_together(3, 77, taking_unless({3, 79}, []), least=5)
    assert [s.start for s in spans] == sorted(s.start for s in spans)
    assert sum(s.length for s in spans) == 77
    assert all(a.start + a.length == b.start for a, b in zip(spans, spans[1:]))
    assert spans[0].start == 3 and spans[-1].start + spans[-1].length == 80
    assert all(s.length < 10 for s in spans if s.taken is None)
