"""Where the swarm secret and the API key come from, and which source wins."""

from __future__ import annotations

import stat

import pytest

from swarm.node.secrets import api_key, new_secret_file, readable_by_others, swarm_secret


def test_the_flag_wins_over_the_environment_which_wins_over_the_file(tmp_path):
    (tmp_path / "secret").write_text("from-file\n")
    assert swarm_secret("from-flag", tmp_path, {"SWARM_SECRET": "from-env"}).value == "from-flag"
    assert swarm_secret(None, tmp_path, {"SWARM_SECRET": "from-env"}).source == "$SWARM_SECRET"
    got = swarm_secret(None, tmp_path, {})
    assert got.value == "from-file" and got.source == str(tmp_path / "secret")
    assert not swarm_secret(None, tmp_path / "nothing-here", {})
    assert api_key(None, tmp_path, {"SWARM_API_KEY": "k"}).value == "k"


def test_an_empty_file_is_an_error_not_an_open_swarm(tmp_path):
    (tmp_path / "secret").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        swarm_secret(None, tmp_path, {})


def test_a_new_secret_is_private_and_never_overwritten(tmp_path):
    path, text = new_secret_file(tmp_path / "state")
    assert len(text) >= 40 and swarm_secret(None, tmp_path / "state", {}).value == text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and not readable_by_others(path)
    with pytest.raises(FileExistsError):
        new_secret_file(tmp_path / "state")


def test_a_new_secret_can_be_given_as_the_flag_it_tells_a_user_to_pass(tmp_path):
    # A secret that began with "-" would be read by swarm-node as an option (`--secret -x...`: "expected
    # one argument"); url-safe base64 begins with one once in 64 draws.
    from swarm.cli import build_parser
    texts = [new_secret_file(tmp_path / f"state{i}")[1] for i in range(400)]
    assert len(set(texts)) == len(texts)
    for text in texts:
        assert build_parser().parse_args(["--secret", text]).secret == text
