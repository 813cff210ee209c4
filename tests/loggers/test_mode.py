"""The mode and target decisions: the user's wandb settings first, offline only without credentials.

Fake netrc files in a temporary HOME; nothing here contacts wandb (the decision functions
only read the environment and files).
"""

import pytest

from divergence.pairfolder.settings import LogConfig
from divergence.loggers.wandb_mode import (
    has_credentials,
    key_part,
    offline_notice,
    wandb_init_mode,
    wandb_offline,
    wandb_target,
)


def _netrc(tmp_path, host="api.wandb.ai", password="k" * 40):
    path = tmp_path / ".netrc"
    path.write_text(f"machine {host}\n  login user\n  password {password}\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    "files, env, mode",
    [
        ({}, {}, "offline"),  # nothing configured
        ({}, {"WANDB_API_KEY": "k" * 40}, "online"),  # an API key
        ({"home": "api.wandb.ai"}, {}, "online"),  # `wandb login` wrote ~/.netrc
        ({"netrc": "api.wandb.ai"}, {}, "online"),  # $NETRC names the file
        ({"home": "example.org"}, {}, "offline"),  # credentials for another host
        ({"home": "wandb.local"}, {"WANDB_BASE_URL": "https://wandb.local"}, "online"),  # a private server
        ({"home": "api.wandb.ai"}, {"WANDB_MODE": "offline"}, "offline"),  # WANDB_MODE wins
        ({}, {"WANDB_MODE": "online"}, "online"),
        ({}, {"WANDB_MODE": "disabled"}, "disabled"),
    ],
)
def test_the_mode_follows_the_users_settings(tmp_path, files, env, mode):
    env = {"HOME": str(tmp_path), **env}
    if "home" in files:
        _netrc(tmp_path, files["home"])
    if "netrc" in files:
        (tmp_path / "elsewhere").mkdir()
        env["NETRC"] = str(_netrc(tmp_path / "elsewhere", files["netrc"]))
    assert wandb_init_mode(env) == mode
    assert wandb_offline(env) is (mode == "offline")


def test_the_offline_notice_gives_the_reason_that_applies():
    assert "(WANDB_MODE=offline)" in offline_notice("runs/x", {"WANDB_MODE": "offline"})
    assert "(no WANDB_MODE, WANDB_API_KEY" in offline_notice("runs/x", {})
    assert offline_notice("runs/x", {}).endswith("upload it later with: wandb sync runs/x")


def test_an_unreadable_netrc_means_no_credentials(tmp_path):
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login\n")  # no password: a parse error or none
    assert not has_credentials({"HOME": str(tmp_path)})
    assert wandb_init_mode({"HOME": str(tmp_path / "missing")}) == "offline"


def test_recipe_keys_then_wandb_variables_then_defaults(tmp_path):
    env = {
        "HOME": str(tmp_path),
        "WANDB_PROJECT": "p-env",
        "WANDB_ENTITY": "e-env",
        "WANDB_RUN_GROUP": "g-env",
        "WANDB_DIR": str(tmp_path / "wdir"),
        "WANDB_TAGS": "t-env, other",
    }
    plain = wandb_target(LogConfig(), "study-x", ("pair:x",), tmp_path / "run", env)
    assert (plain.project, plain.entity, plain.group, plain.dir) == ("p-env", "e-env", "g-env", str(tmp_path / "wdir"))
    assert plain.tags == ("pair:x", "t-env", "other") and plain.mode == "offline"
    mine = LogConfig(project="p", entity="e", group="g", tags=("nightly",))
    chosen = wandb_target(mine, "study-x", ("pair:x",), tmp_path / "run", env)
    assert (chosen.project, chosen.entity, chosen.group) == ("p", "e", "g")
    assert chosen.tags == ("pair:x", "nightly", "t-env", "other")
    default = wandb_target(None, "study-x", (), tmp_path / "run", {"HOME": str(tmp_path)})
    assert (default.project, default.entity, default.group, default.dir) == (
        "divergence",
        None,
        "study-x",
        str(tmp_path / "run"),
    )


@pytest.mark.parametrize(
    "name, part",
    [
        ("unet.down_blocks.0.attentions.1", "unet_down_blocks_0_attentions_1"),
        ("flash-vs-baseline", "flash_vs_baseline"),
        ("attn_q", "attn_q"),
        ("0", "_0"),
        ("a b,c", "a_b_c"),
    ],
)
def test_key_parts_are_what_wandb_can_sort_and_filter_by(name, part):
    assert key_part(name) == part


@pytest.mark.parametrize(
    "override, message",
    [
        ("log.tags=[a, '']", "log.tags"),
        ("log.artifacts=[-1]", "log.artifacts"),
        ("log.group=''", "log.group"),
        ("log.tags=" + "[" + "x" * 65 + "]", "log.tags"),
    ],
)
def test_bad_log_keys_name_the_key(override, message):
    from divergence.errors import RecipeError
    from tests.training.tiny import tiny_recipe

    with pytest.raises(RecipeError, match=message):
        tiny_recipe(override)
