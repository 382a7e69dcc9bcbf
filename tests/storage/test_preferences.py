from storage.preferences import Preferences


def test_a_preference_is_kept_across_instances(kvchat_home):
    Preferences().set("theme", "nord")
    Preferences().set("other", 3)
    assert Preferences().get("theme") == "nord" and Preferences().get("other") == 3
    assert not list(kvchat_home.glob(".*.tmp"))


def test_a_missing_or_damaged_file_reads_as_no_preferences(tmp_path):
    prefs = Preferences(tmp_path / "p.json")
    assert prefs.get("theme", "textual-dark") == "textual-dark"
    prefs.path.write_text("{not json")
    assert prefs.read() == {}
    prefs.path.write_text("[1, 2]")
    assert prefs.get("theme") is None
    prefs.set("theme", "nord")  # a damaged file is replaced, not a reason to fail
    assert prefs.get("theme") == "nord"
