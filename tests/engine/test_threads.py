"""run_in_fresh_thread: results and errors cross back; the thread is gone afterwards."""

import threading

import pytest

from augury.engine.threads import run_in_fresh_thread


def test_returns_the_result_from_another_thread():
    main = threading.get_ident()
    ident = run_in_fresh_thread(threading.get_ident)
    assert ident != main
    assert run_in_fresh_thread(lambda: 41 + 1) == 42


def test_reraises_the_error():
    def boom():
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        run_in_fresh_thread(boom)


def test_the_thread_has_exited():
    # its OpenMP pool leaves with it: what the engine's start-up relies on
    names = []
    run_in_fresh_thread(lambda: names.append(threading.current_thread().name), name="probe-setup")
    assert names == ["probe-setup"]
    assert all(t.name != "probe-setup" for t in threading.enumerate())


def test_engine_loads_off_the_calling_thread(monkeypatch):
    """Engine.build loads and constructs in a set-up thread, never on the caller's."""
    from augury.engine import engine as engine_mod

    seen = []

    def fake_load(config):
        seen.append(threading.get_ident())
        raise RuntimeError("stop here")

    monkeypatch.setattr(engine_mod, "load_model", fake_load)
    with pytest.raises(RuntimeError, match="stop here"):
        engine_mod.Engine.build(engine_mod.EngineConfig(model="x"))
    assert seen and seen[0] != threading.get_ident()
