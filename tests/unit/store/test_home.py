"""The region's home on a host (store/home.py): names, the kernel's table, conflicts."""

from __future__ import annotations

import os

import pytest

from snowfence.errors import RegionHeld
from snowfence.store.home import MAX_NAME_BYTES, Home, HomeHold, conflicts, read_homes, refusal


def table(*names: str) -> str:
    head = "Num       RefCount Protocol Flags    Type St Inode Path\n"
    rows = [f"0000000000000000: 00000002 00000000 00000000 0002 01 {1000 + i} @{n[1:]}" for i, n in enumerate(names)]
    return head + "\n".join(rows) + "\n"


def test_a_name_reads_back_as_the_home_it_names_even_with_colons_and_spaces_in_the_path():
    home = Home(3, "dir-fd01-1a2b", 4242, "/srv/ids: a b/state")
    assert Home.parse(home.name()[1:]) == home
    assert read_homes(table(home.name())) == [home]


def test_a_long_path_is_cut_from_the_front_to_fit_a_socket_name():
    home = Home(1023, "dir-ffffffff-ffffffffffffffff", 4194304, "/x" * 200 + "/state")
    name = home.name()
    assert len(name.encode()) - 1 <= MAX_NAME_BYTES
    parsed = Home.parse(name[1:])
    assert parsed.where.startswith("...") and parsed.where.endswith("/x/state")
    assert parsed.key == home.key and parsed.pid == home.pid


@pytest.mark.parametrize(
    "line", ["@snowfence:home:", "@snowfence:home:r0:dir-1-2", "@snowfence:home:rX:dir-1:2:/a", "@snowfence:dir-1:0:1"]
)
def test_names_not_ours_are_passed_over(line):
    assert read_homes(table("\0" + line[1:])) == []


def test_only_another_home_of_the_same_region_conflicts():
    mine = Home(0, "dir-1-2", 10, "/a")
    same_dir = Home(0, "dir-1-2", 11, "/alias")
    other_region = Home(1, "dir-1-3", 12, "/b")
    other_dir = Home(0, "dir-1-3", 13, "/b")
    etcd = Home(0, "etcd-abc", 14, "default")
    assert conflicts(mine, [mine, same_dir, other_region, other_dir, etcd]) == [other_dir, etcd]
    # etcd-mode homes are told apart by etcd's region claim, not here; an embedded one is seen.
    assert conflicts(etcd, [Home(0, "etcd-def", 15, "other"), mine]) == [mine]


def test_the_refusal_names_the_directory_the_process_and_the_ways_out():
    err = refusal(Home(0, "dir-1-3", 13, "/b"), [Home(0, "dir-1-2", 10, "/a")])
    assert isinstance(err, RegionHeld) and err.code == "region_held"
    text = str(err)
    assert "state directory /a (pid 10)" in text and "--state-dir /a" in text and "--region N" in text


def test_holding_binds_a_name_the_kernel_lists_and_a_second_home_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    first = HomeHold(Home(5, f"dir-{os.stat(a).st_dev:x}-{os.stat(a).st_ino:x}", 1, str(a)))
    first.hold()
    try:
        assert (first.home.key, first.home.pid) in {(h.key, h.pid) for h in read_homes() or []}
        second = HomeHold(Home(5, f"dir-{os.stat(b).st_dev:x}-{os.stat(b).st_ino:x}", 2, str(b)))
        with pytest.raises(RegionHeld, match="test_holding_binds_a_name_the_0/a "):
            second.hold()
        assert second.sock is None and 2 not in {h.pid for h in read_homes() or []}
        sharer = HomeHold(Home(5, first.home.key, 3, str(a)))
        sharer.hold()
        sharer.close()
    finally:
        first.close()
    assert 1 not in {h.pid for h in read_homes() or []}


def test_without_the_kernels_table_a_node_holds_its_name_and_says_it_saw_nothing(tmp_path, monkeypatch):
    from pathlib import Path

    real = Path.read_text

    def no_table(self, *args, **kwargs):
        if str(self) == "/proc/net/unix":
            raise PermissionError("not readable here")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", no_table)
    assert read_homes() is None
    hold = HomeHold(Home(6, "dir-1-2", 7, str(tmp_path)))
    try:
        assert hold.hold() is None and hold.sock is not None  # held, so a later node sees it
    finally:
        hold.close()
