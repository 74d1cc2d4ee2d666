"""Images through the SDK: a docker save tarball made here, imported, a
sandbox made of it, and the image refused removal while that sandbox lives."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import uuid

import pytest

from berth import Berth, Conflict, InvalidArgument, NotFound


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _docker_save(tag: str, files: dict[str, bytes]) -> bytes:
    layer = _tar(files)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["GREETING=from-image"], "WorkingDir": "/srv", "User": "0"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]).encode()
    return _tar({"manifest.json": manifest, config_name: config, "layer.tar": layer})


# Each run's images are its own (the suite runs once per client on one
# daemon): a nonce in the tags and in a layer's files.
def _nonce() -> str:
    return uuid.uuid4().hex[:8]


def test_import_an_image_and_make_a_sandbox_of_it(client: Berth) -> None:
    n = _nonce()
    tag = f"sdk.test/greeting-{n}:1"
    imgs = client.import_image(_docker_save(tag, {"srv/hello.txt": b"hello from an image\n", "srv/nonce": n.encode()}))
    assert imgs[0]["names"] == [tag]
    image_id = imgs[0]["id"]
    assert any(i["id"] == image_id for i in client.list_images())
    with client.create(image=tag) as sb:
        assert sb.info.raw["workdir"] == "/srv" and sb.info.raw["env"]["GREETING"] == "from-image"
        assert sb.info.raw["image_id"] == image_id
        assert sb.download("hello.txt") == b"hello from an image\n"
        with pytest.raises(Conflict) as exc:
            client.remove_image(tag)
        assert sb.id in exc.value.message
        assert client.inspect_image(tag)["in_use"] == [sb.id]
    client.remove_image(image_id)
    with pytest.raises(NotFound):
        client.inspect_image(tag)


def test_build_a_template_from_a_dockerfile(client: Berth, tmp_path) -> None:
    """A template built from a directory with a Dockerfile, on an imported
    image: its files and config reach the sandboxes made of it, and the same
    build again takes every step from the cache."""
    n = _nonce()
    base = f"sdk.test/template-base-{n}:1"
    client.import_image(_docker_save(base, {"srv/hello.txt": b"hello from an image\n", "srv/nonce": n.encode()}))
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base}\nENV STAGE=built\nWORKDIR /srv/app\nCOPY app/ ./\nCOPY notes.txt /srv/notes/\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('hi')\n")
    (tmp_path / "notes.txt").write_text("notes\n")
    (tmp_path / "secret.txt").write_text("never sent\n")
    (tmp_path / ".dockerignore").write_text("secret.txt\n")
    res = client.build_template(f"sdk.test/agent-env-{n}:1", tmp_path)
    assert res["executed"] == 3 and res["cached_steps"] == 0, res
    assert res["image"]["template"] and res["image"]["config"]["working_dir"] == "/srv/app"
    assert any(t["id"] == res["image"]["id"] for t in client.list_templates())
    with client.create(image=f"sdk.test/agent-env-{n}:1") as sb:
        assert sb.info.raw["env"]["STAGE"] == "built" and sb.info.raw["workdir"] == "/srv/app"
        assert sb.download("main.py") == b"print('hi')\n"
        assert sb.download("/srv/notes/notes.txt") == b"notes\n"
        assert sb.download("/srv/hello.txt") == b"hello from an image\n"
    again = client.build_template(f"sdk.test/agent-env-{n}:1", tmp_path)
    assert again["executed"] == 0 and again["cached_steps"] == 3 and again["image"]["id"] == res["image"]["id"]
    with pytest.raises(InvalidArgument) as exc:
        client.build_template("sdk.test/broken:1", _tar({"Dockerfile": f"FROM {base}\nVOLUME /data\n".encode()}))
    assert "line 2" in exc.value.message and "VOLUME" in exc.value.message
    (tmp_path / "Dockerfile.secret").write_text(f"FROM {base}\nCOPY secret.txt /x\n")
    with pytest.raises(NotFound) as exc:  # .dockerignore kept secret.txt out of the context
        client.build_template("sdk.test/broken:1", tmp_path, dockerfile="Dockerfile.secret")
    assert "secret.txt" in exc.value.message
