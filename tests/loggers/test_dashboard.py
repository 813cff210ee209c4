"""``divergence dashboard``: every section, and only keys the runs log (read from their files)."""

import json
import re

import pytest

from divergence.cli import main
from divergence.loggers.dashboard import dashboard_sections

from .runfile import history_keys, run_files

SECTIONS = ["Whole model", "Per kind", "Most divergent layers", "Losses and spikes", "Attention output", "Dose ratio"]
PREFIXES = ("divergence/", "train/", "attention/", "report/")


def _spec(capsys, *args):
    assert main(["dashboard", "--entity", "team", "--project", "proj", *args, "--dry-run"]) == 0
    return json.loads(capsys.readouterr().out)


def _strings(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def test_the_spec_holds_every_section_over_the_group(capsys):
    spec = _spec(capsys, "--group", "study-x")
    sections = spec["spec"]["section"]["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == SECTIONS and all(s["panels"] for s in sections)
    assert (spec["entity"], spec["project"]) == ("team", "proj")
    [runset] = spec["spec"]["section"]["runSets"]
    assert any(f.get("value") == "study-x" and f["key"]["name"] == "group" for f in runset["filters"]["filters"])


@pytest.mark.parametrize("group", ["bob's", 'say "hi"', "back\\slash", "two\nlines", "x' or Group != '", "b+c$|^"])
def test_any_group_is_filtered_on_exactly(group, capsys):
    """A group with quotes used to be pasted into the filter expression: a traceback."""
    [runset] = _spec(capsys, "--group", group)["spec"]["section"]["runSets"]
    assert [(f["key"]["name"], f["op"], f["value"]) for f in runset["filters"]["filters"]] == [("group", "=", group)]


@pytest.mark.parametrize("group", ["a=b", "x<y", "x>y"])
def test_a_group_wandb_would_filter_as_another_is_one_line(group, capsys):
    assert main(["dashboard", "--entity", "team", "--project", "proj", "--group", group, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"divergence dashboard: error: --group {group!r}") and err.count("\n") == 1, err


def test_a_view_name_wandb_refuses_is_one_line(capsys):
    assert main(["dashboard", "--entity", "team", "--project", "proj", "--name", "a=b", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("divergence dashboard: error: --name 'a=b'") and err.count("\n") == 1, err


def test_the_spec_names_only_keys_the_runs_log(capsys, shadow_pair, report_run):
    logged = set()
    for folder in (shadow_pair[0], report_run[0]):
        for path in run_files(folder):
            logged |= history_keys(path)
    named = {
        s for s in _strings(_spec(capsys)) if s.startswith(PREFIXES) or s.startswith(("^divergence", "^attention"))
    }
    assert named, "the spec names no keys"
    for key in named:
        if key.startswith("^"):
            assert any(re.match(key, k) for k in logged), key  # a pattern: matches logged keys
        else:
            assert key in logged, key
    # and each section's panels name something: the plain spec and the saved one agree
    for section in dashboard_sections():
        for panel in section.panels:
            assert (set(panel.keys) & named) or panel.regex in named, (section.name, panel.title)


def test_missing_entity_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("WANDB_ENTITY", raising=False)
    assert main(["dashboard", "--project", "p", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--entity" in err


def test_saving_without_credentials_says_what_to_do(capsys, monkeypatch, tmp_path):
    for key in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "missing"))
    assert main(["dashboard", "--entity", "e", "--project", "p"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "wandb login" in err and "--dry-run" in err
