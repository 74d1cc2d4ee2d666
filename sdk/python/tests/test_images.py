"""Images through the SDK: a docker save tarball made here, imported, a
sandbox made of it, and the image refused removal while that sandbox lives."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from berth import Berth, Conflict, NotFound


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


def test_import_an_image_and_make_a_sandbox_of_it(client: Berth) -> None:
    tag = "sdk.test/greeting:1"
    imgs = client.import_image(_docker_save(tag, {"srv/hello.txt": b"hello from an image\n"}))
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
