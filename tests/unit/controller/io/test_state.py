from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from controller.core.actions import DeleteShadow
from controller.core.share_solver import plan_shadows
from controller.errors import StateError
from controller.io.state import FILE_NAME, SCHEMA_VERSION, TIMER_SHADOW_EMPTY, TIMER_SPOT_BACK, StateStore
from gpushare.config import Config
from tests.unit.controller.podmaker import NODE, shadow, snap


def test_timers_replace_per_kind_and_survive_a_restart(tmp_path: Path) -> None:
    with StateStore(tmp_path / "state") as store:
        assert store.schema_version == SCHEMA_VERSION
        store.save_timers(TIMER_SHADOW_EMPTY, {"uid-a": 10.5, "uid-b": 20.0})
        store.save_timers(TIMER_SPOT_BACK, {"GPU-0": 30.0})
        store.save_timers(TIMER_SHADOW_EMPTY, {"uid-b": 20.0})  # uid-a got a sharer: its clock is gone
    with StateStore(tmp_path / "state") as store:
        assert store.load_timers(TIMER_SHADOW_EMPTY) == {"uid-b": 20.0}
        assert store.load_timers(TIMER_SPOT_BACK) == {"GPU-0": 30.0}
        assert store.load_timers("nothing") == {}


def test_counters_add_up_across_restarts(tmp_path: Path) -> None:
    with StateStore(tmp_path) as store:
        store.add_counter("evictions", "OwnerBack")
        store.add_counter("evictions", "OwnerBack", 2)
        store.add_counter("evictions", "ShadowGone")
    with StateStore(tmp_path) as store:
        store.add_counter("evictions", "ShadowGone", 0)
        assert store.counters() == {("evictions", "OwnerBack"): 3, ("evictions", "ShadowGone"): 1}
        with pytest.raises(ValueError, match="must not be negative"):
            store.add_counter("evictions", "OwnerBack", -1)
        assert store.counters()[("evictions", "OwnerBack")] == 3


def test_a_newer_schema_is_refused_and_left_untouched(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / FILE_NAME)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StateError, match=r"schema version 2, newer than this agent's 1") as err:
        StateStore(tmp_path)
    assert str(tmp_path / FILE_NAME) in str(err.value)
    db = sqlite3.connect(tmp_path / FILE_NAME)
    assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION + 1,)
    db.close()


def test_a_damaged_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StateError, match="move it away"):
        StateStore(tmp_path)


def test_an_unusable_state_dir_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StateError, match="stateDir") as err:
        StateStore(blocker / "sub")
    assert str(blocker / "sub") in str(err.value)


def test_an_idle_clock_survives_an_agent_restart(tmp_path: Path) -> None:
    cfg = Config(node_name=NODE, state_dir=str(tmp_path))
    s = snap([shadow("s")], cfg)
    with StateStore(cfg.state_dir) as store:  # the agent before the restart
        plan = plan_shadows(s, cfg, 1000.0, store.load_timers(TIMER_SHADOW_EMPTY))
        store.save_timers(TIMER_SHADOW_EMPTY, plan.empty_since)
    with StateStore(cfg.state_dir) as store:  # after: the clock still reads from 1000, not from now
        later = plan_shadows(s, cfg, 1000.0 + cfg.shadow_idle_timeout_s, store.load_timers(TIMER_SHADOW_EMPTY))
    assert [a.ref.name for a in later.actions if isinstance(a, DeleteShadow)] == ["s"]
