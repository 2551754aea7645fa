from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from controller.core.actions import AnnotatePod
from controller.core.idle_history import TrackRecord
from controller.errors import StateError
from controller.io import state as state_module
from controller.io.state import FILE_NAME, SCHEMA_VERSION, TIMER_SHADOW_EMPTY, TIMER_SPOT_BACK, StateStore
from controller.share.solver import plan_shadows
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
    newer = rf"schema version {SCHEMA_VERSION + 1}, newer than this agent's {SCHEMA_VERSION}"
    with pytest.raises(StateError, match=newer) as err:
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
    # Removal starts by marking the shadow draining (controller/share/shadow_drain.py).
    assert [a.ref.name for a in later.actions if isinstance(a, AnnotatePod) and a.value] == ["s"]


TRACKS = [
    TrackRecord("GPU-0", 1000.5, "idling", 400.25, "idle reading", 0.0, ("team/dev", "spot/job")),
    TrackRecord("GPU-1", 1001.0, "busy", None, "busy reading", 87.5, ()),
    TrackRecord("GPU-2", 999.0, "unknown", None, "scrape failed: timed out", None, ()),
]


def test_idle_tracks_survive_a_restart_and_a_save_replaces_them_all(tmp_path: Path) -> None:
    with StateStore(tmp_path) as store:
        assert store.load_idle_tracks() == []
        store.save_idle_tracks(TRACKS)
    with StateStore(tmp_path) as store:
        assert store.load_idle_tracks() == TRACKS
        store.save_idle_tracks(TRACKS[1:2])  # the others left the node
        assert store.load_idle_tracks() == TRACKS[1:2]
        store.save_idle_tracks([])
        assert store.load_idle_tracks() == []


def test_two_owners_write_the_same_file(tmp_path: Path) -> None:
    # The reconcile thread keeps timers, the utilization watcher idle tracks: two connections.
    with StateStore(tmp_path) as loop_store, StateStore(tmp_path) as watcher_store:
        loop_store.save_timers(TIMER_SPOT_BACK, {"GPU-0": 5.0})
        watcher_store.save_idle_tracks(TRACKS)
        loop_store.add_counter("evictions", "OwnerBack")
        assert watcher_store.load_timers(TIMER_SPOT_BACK) == {"GPU-0": 5.0}
        assert loop_store.load_idle_tracks() == TRACKS
    # Write-ahead log: a save costs one fsync, and one owner's write never blocks the other's read.
    db = sqlite3.connect(tmp_path / FILE_NAME)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()


def test_a_version_1_file_is_migrated_and_keeps_its_timers(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / FILE_NAME)
    for statement in state_module._MIGRATIONS[1]:  # the file as the version-1 agent left it
        db.execute(statement)
    db.execute("INSERT INTO timers VALUES ('spot-back', 'GPU-0', 12.5)")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    with StateStore(tmp_path) as store:
        assert store.schema_version == SCHEMA_VERSION == 2
        assert store.load_timers(TIMER_SPOT_BACK) == {"GPU-0": 12.5}
        assert store.load_idle_tracks() == []
        store.save_idle_tracks(TRACKS[:1])
    with StateStore(tmp_path) as store:  # opened again: nothing migrates twice
        assert store.load_idle_tracks() == TRACKS[:1]


def test_a_store_opened_on_one_thread_writes_from_another(tmp_path: Path) -> None:
    # The watcher restores at start (the agent's thread) and saves from its scrape thread.
    store = StateStore(tmp_path)
    errors: list[BaseException] = []

    def save() -> None:
        try:
            store.save_idle_tracks(TRACKS)
        except BaseException as exc:  # reported below: a thread's exception would be lost
            errors.append(exc)

    thread = threading.Thread(target=save)
    thread.start()
    thread.join(10)
    store.close()
    assert errors == []
    with StateStore(tmp_path) as again:
        assert again.load_idle_tracks() == TRACKS
