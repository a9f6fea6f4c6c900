import pytest

from offsetlake import faults


@pytest.mark.parametrize("configured", [{}, {"after_plan": "pause"}])
def test_a_point_with_no_fault_configured_returns_at_once_and_leaves_no_trace(tmp_path, configured):
    # driver_pid 0 would be signalled (this whole process group) if `exit` were taken by mistake.
    result = faults.hit("before_commit", {"faults": configured, "dir": str(tmp_path), "driver_pid": 0})
    assert result is None
    assert list(tmp_path.iterdir()) == []  # no .reached marker: nothing paused


def test_parse_faults():
    assert faults.parse("after_plan:exit, before_commit:pause") == {"after_plan": "exit", "before_commit": "pause"}
    assert faults.parse("") == {}


@pytest.mark.parametrize("spec", ["nowhere:exit", "after_plan:explode", "after_plan"])
def test_bad_fault_specs_are_rejected(spec):
    with pytest.raises(ValueError, match="OFFSETLAKE_FAULT"):
        faults.parse(spec)


def test_pause_waits_for_release(tmp_path):
    import threading

    settings = {"faults": {"after_plan": "pause"}, "dir": str(tmp_path), "driver_pid": 0}
    done = threading.Event()
    t = threading.Thread(target=lambda: (faults.hit("after_plan", settings), done.set()))
    t.start()
    for _ in range(100):
        if (tmp_path / "after_plan.reached").exists():
            break
        done.wait(0.05)
    assert (tmp_path / "after_plan.reached").exists() and not done.is_set()
    (tmp_path / "after_plan.release").touch()
    t.join(5)
    assert done.is_set()
