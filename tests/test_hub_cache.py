"""`--model mlx-community/Foo` finds the model in the local Hugging Face cache, as mlx-lm's tools do.

The cache is built here, offline, in huggingface_hub's own layout
(models--org--name/refs/main naming a commit, snapshots/<commit>/ holding the
files); no hub is reachable and none is contacted (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

from model_zoo import build_random_model
from node_process import running_node

from reference import reference_chat

REPO = "mlx-community/Tiny-Qwen3-4bit"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def populate_cache(root: Path, repo: str, model_dir: Path) -> Path:
    org, name = repo.split("/")
    repo_dir = root / f"models--{org}--{name}"
    snapshot = repo_dir / "snapshots" / COMMIT
    shutil.copytree(model_dir, snapshot)
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_resolve_finds_a_cached_repo_by_id(tmp_path):
    model = build_random_model(tmp_path / "m", "qwen3", n_layers=2, quantize="4bit")
    snapshot = populate_cache(tmp_path / "hub", REPO, model)
    code = ("from swarm.models.resolve import resolve_model; m = resolve_model('%s'); "
            "print(m.path, m.model_id, m.n_layers)" % REPO)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(snapshot), REPO, "2"]


def test_a_node_serves_a_cached_repo_id(tmp_path):
    model = build_random_model(tmp_path / "m", "qwen3", n_layers=4, quantize="4bit", seed=3)
    populate_cache(tmp_path / "hub", REPO, model)
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    # --dequantize no: the 4-bit weights stay packed (a CPU node dequantizes by default).
    with running_node(tmp_path, "--model", REPO, "--speed", "0.002", "--dequantize", "no", env=env) as node:
        models = json.loads(urllib.request.urlopen(node.url + "/v1/models", timeout=10).read())
        assert [m["id"] for m in models["data"]] == [REPO]
        body = json.dumps({"model": REPO, "messages": [{"role": "user", "content": "Count to five."}],
                           "max_tokens": 12, "temperature": 0}).encode()
        req = urllib.request.Request(node.url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]["message"]["content"]
        health = node.health()[1]
    assert health["weights"] == "4-bit affine (group 32) + float32", health["weights"]
    # The node casts floats to float32 on a CPU backend; mlx-lm runs the stored dtype. A 4-bit
    # model of float32 floats (what the zoo writes) runs the same either way.
    assert answer == reference_chat(model, [{"role": "user", "content": "Count to five."}], 12)[0]
