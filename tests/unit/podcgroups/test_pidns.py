"""podcgroups.pidns: the pid-namespace inode of a process."""

from __future__ import annotations

import os
import subprocess

import pytest

from podcgroups.errors import ProcessError
from podcgroups.pidns import pidns_inode


def test_pidns_inode_of_self_matches_stat_and_gone_pid_is_named() -> None:
    assert pidns_inode(os.getpid()) == os.stat("/proc/self/ns/pid").st_ino
    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(ProcessError, match=rf"/proc/{p.pid}/ns/pid does not exist"):
        pidns_inode(p.pid)
