"""The layer audit's rules as pure functions of a listing (dedal.model.layer_rules); the
audit of real squashfs files is tests/stages/test_layer_audit.py."""

from __future__ import annotations

from dedal.model import layer_rules as R


def test_a_layer_listing_stays_in_its_prefix_and_install_root() -> None:
    ok = [
        {"path": "p", "mode": "drwxr-xr-x"},
        {"path": "p/bin", "mode": "drwxr-xr-x"},
        {"path": "p/bin/x", "mode": "lrwxrwxrwx", "target": "/opt/r/q/bin/x"},
    ]
    assert R.listing_problem(ok, "p", "/opt/r") is None
    assert "outside its prefix" in R.listing_problem(ok + [{"path": "q/y", "mode": "-rw-r--r--"}], "p", "/opt/r")
    assert "setuid" in R.entry_problem({"path": "p/s", "mode": "-rwsr-xr-x"}, "p", "/opt/r")
    assert "points outside" in R.symlink_problem("p/l", "/etc/passwd", "/opt/r")
    assert R.prefix_problem("a/b") and R.root_problem("rel") and R.prefix_problem("p") is None


def test_an_image_root_allows_the_base_systems_setuid_programs_and_harmless_devices() -> None:
    assert R.image_entry_problem({"path": "usr/bin/su", "mode": "-rwsr-xr-x"}, "/opt/r") is None
    assert R.image_entry_problem({"path": "dev/null", "mode": "crw-rw-rw-", "size": "1,3"}, "/opt/r") is None
    assert "device node" in R.image_entry_problem({"path": "dev/mem", "mode": "crw-r-----", "size": "1,1"}, "/opt/r")
    assert "climbs out" in R.image_entry_problem({"path": "a/l", "mode": "lrwxrwxrwx", "target": "../../x"}, None)


def test_both_listings_refuse_nothing_a_line_that_is_no_entry_and_a_path_twice() -> None:
    entry = {"path": "p", "mode": "drwxr-xr-x"}
    layer = lambda entries: R.listing_problem(entries, "p", "/opt/r")  # noqa: E731
    image = lambda entries: R.image_listing_problem(entries, "/opt/r")  # noqa: E731
    assert layer([]) == "the squashfs holds nothing"
    assert image([]) == "its root file system holds nothing"
    for problem in (layer, image):
        assert "line break" in problem([entry, {"unparsed": "p/a"}])
    assert layer([entry, entry]) == "path 'p' is listed twice"
    assert image([entry, entry]) == "path '/p' is listed twice"
    assert layer([entry]) is None and image([entry]) is None
