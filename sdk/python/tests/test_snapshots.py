"""Snapshots, forks, diff, apply, pause and resume through the SDK: a
snapshot made into a sandbox, three forks with the files and none of the
processes, a diff in its three formats, applies that merge, conflict and
overwrite, a paused sandbox refusing exec, the sync and async clients, and
the deepagents backend branching."""

from __future__ import annotations

import asyncio
import io
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from berth import (
    MERGE_CONFLICT,
    AlreadyExists,
    AsyncBerth,
    Berth,
    Conflict,
    InvalidArgument,
    NotFound,
    NotImplementedByRuntime,
    Sandbox,
    Snapshot,
)
from berth.deepagents import BerthSandbox

HOME = "/home/user"


def _name(what: str) -> str:
    """A snapshot name no other test of the session takes."""
    return f"sdk-{what}-{uuid.uuid4().hex[:8]}"


@contextmanager
def _deleting(*sandboxes: Sandbox) -> Iterator[None]:
    try:
        yield
    finally:
        for sb in sandboxes:
            try:
                sb.delete()
            except NotFound:
                pass


def _tar_names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return tf.getnames()


def test_runtimes_say_what_they_can(client: Berth) -> None:
    rt = next(r for r in client.runtimes() if r.get("default"))
    caps = rt["capabilities"]
    assert caps["pause"] is True and caps["snapshot"] is True
    assert isinstance(caps["memory_checkpoint"], bool)


def test_a_snapshot_made_into_a_sandbox(client: Berth) -> None:
    name = _name("notes")
    with client.create(labels={"suite": "sdk"}) as sb:
        sb.write(f"{HOME}/notes.txt", "taken before the snapshot\n")
        snap = sb.snapshot(name, labels={"suite": "sdk-snapshots", "kind": "notes"})
        assert isinstance(snap, Snapshot)
        assert snap.id.startswith("snap-") and snap.name == name and snap.sandbox == sb.id
        assert snap.ref == f"snapshot:{name}" and snap.labels == {"suite": "sdk-snapshots", "kind": "notes"}
        assert snap.size_bytes > 0 and snap.frozen_ms >= 0 and snap.created_at
        # The sandbox goes on; what it writes now is not in the snapshot.
        sb.write(f"{HOME}/later.txt", "after\n")
        with pytest.raises(AlreadyExists):
            sb.snapshot(name)
        with pytest.raises(InvalidArgument):
            sb.snapshot("no spaces allowed")

    listed = client.list_snapshots(selector="suite=sdk-snapshots")
    assert name in [s.name for s in listed]
    assert name in [s.name for s in client.list_snapshots({"kind": "notes"})]
    assert name not in [s.name for s in client.list_snapshots({"kind": "other"})]
    assert client.get_snapshot(name).in_use == []
    assert client.get_snapshot(f"snapshot:{name}").id == snap.id

    # It outlives its sandbox and is an image: by "snapshot:NAME" or the Snapshot itself.
    with client.create(image=f"snapshot:{name}") as copy, client.create(image=snap) as copy2:
        assert copy.download(f"{HOME}/notes.txt") == b"taken before the snapshot\n"
        assert copy2.download(f"{HOME}/notes.txt") == b"taken before the snapshot\n"
        assert not copy.exists(f"{HOME}/later.txt")
        assert sorted(client.get_snapshot(name).in_use) == sorted([copy.id, copy2.id])
        # Deleting it is refused while sandboxes are made from it, naming them.
        with pytest.raises(Conflict) as exc:
            client.delete_snapshot(name)
        assert copy.id in exc.value.message
        # A snapshot of a sandbox made from a snapshot stacks on it.
        child = copy.snapshot(_name("child"))
        assert child.parent == snap.id
        client.delete_snapshot(child)
    client.delete_snapshot(name)
    with pytest.raises(NotFound):
        client.get_snapshot(name)
    with pytest.raises(NotFound):
        client.delete_snapshot(name)


def test_three_forks(client: Berth) -> None:
    with client.create(labels={"role": "source"}) as sb:
        sb.write(f"{HOME}/work.txt", "state to branch from\n")
        pid = sb.start_process(["sleep", "300"])
        forks = sb.fork(3, labels=[{"branch": str(i)} for i in range(3)])
        with _deleting(*forks):
            assert len(forks) == 3 and all(type(f) is type(sb) for f in forks)
            assert forks.snapshot.startswith("snap-") and forks.frozen_ms >= 0
            assert len({f.id for f in forks} | {sb.id}) == 4
            for i, f in enumerate(forks):
                assert f.info.state == "running"
                assert f.info.labels == {"branch": str(i), "berth.fork_of": sb.id}
                assert f.download(f"{HOME}/work.txt") == b"state to branch from\n"
                # The files, none of the processes.
                assert f.list_processes() == []
                cmdlines = f.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout
                assert "sleep 300" not in cmdlines
            # The copies are apart: from each other and from the source.
            forks[0].write(f"{HOME}/work.txt", "branch 0\n")
            assert forks[1].download(f"{HOME}/work.txt") == b"state to branch from\n"
            assert sb.download(f"{HOME}/work.txt") == b"state to branch from\n"
            assert sb.get_process(pid).running
            assert {s.id for s in client.list(selector=f"berth.fork_of={sb.id}")} == {f.id for f in forks}

        # One mapping labels every copy; no count is one copy.
        more = sb.fork(2, labels={"batch": "b"})
        one = sb.fork()
        with _deleting(*more, *one):
            assert [f.info.labels["batch"] for f in more] == ["b", "b"]
            assert len(one) == 1 and one[0].info.labels == {"berth.fork_of": sb.id}
        with pytest.raises(InvalidArgument):
            sb.fork(1, labels=[{"a": "1"}, {"a": "2"}])


def test_diff_in_three_formats(client: Berth) -> None:
    with client.create() as sb:
        sb.write(f"{HOME}/keep.txt", "one\ntwo\nthree\n")
        sb.write(f"{HOME}/gone.txt", "bye\n")
        base = sb.snapshot(_name("diff-base"))
        sb.write(f"{HOME}/keep.txt", "one\nTWO\nthree\n")
        sb.remove(f"{HOME}/gone.txt")
        sb.write(f"{HOME}/new.txt", "hello\n")

        d = sb.diff(against=base.name)
        assert d.against == f"snapshot:{base.name}"
        kinds = {c.path: c.kind for c in d.changes}
        assert kinds == {f"{HOME}/keep.txt": "modified", f"{HOME}/gone.txt": "deleted", f"{HOME}/new.txt": "added"}
        assert d.paths("added") == [f"{HOME}/new.txt"]
        new = next(c for c in d.changes if c.path == f"{HOME}/new.txt")
        assert new.type == "file" and new.size == 6 and new.mode == 0o644 and new.uid == 1000
        # Against the snapshot as "snapshot:NAME" or as the Snapshot: the same.
        assert sb.diff(against=base.ref).changes == d.changes == sb.diff(against=base).changes
        # Against its image: both files it wrote are added, the one it removed is not there.
        vs_image = sb.diff()
        assert vs_image.against == sb.info.raw["image"]
        assert set(vs_image.paths()) >= {f"{HOME}/keep.txt", f"{HOME}/new.txt"}
        assert f"{HOME}/gone.txt" not in vs_image.paths()

        patch = sb.diff_patch(base)
        assert "-two\n" in patch and "+TWO\n" in patch
        assert "+hello\n" in patch and "-bye\n" in patch
        assert "+++ b/home/user/new.txt" in patch and "deleted file mode" in patch

        names = _tar_names(sb.diff_tar(base))
        assert "home/user/.wh.gone.txt" in names
        assert "home/user/new.txt" in names and "home/user/keep.txt" in names

        with pytest.raises(NotFound):
            sb.diff(against="no-such-snapshot")
        client.delete_snapshot(base)


def test_apply_merges_conflicts_and_overwrites(client: Berth) -> None:
    with client.create() as sb:
        sb.write(f"{HOME}/shared.txt", "original\n")
        a, b = sb.fork(2)
        with _deleting(a, b):
            a.write(f"{HOME}/shared.txt", "from a\n")
            a.write(f"{HOME}/a.txt", "only in a\n")
            b.write(f"{HOME}/shared.txt", "from b\n")
            b.write(f"{HOME}/b.txt", "only in b\n")

            # a's changes since the fork come over: sb changed none of those paths.
            res = sb.apply(a)
            assert {c.path: c.kind for c in res.changes} == {f"{HOME}/shared.txt": "modified", f"{HOME}/a.txt": "added"}
            assert res.conflicts == [] and res.entries >= 2
            assert sb.download(f"{HOME}/shared.txt") == b"from a\n"
            assert sb.download(f"{HOME}/a.txt") == b"only in a\n"

            # b changed shared.txt too, differently: refused, nothing applied.
            with pytest.raises(Conflict) as exc:
                sb.apply(b.id)
            err = exc.value
            assert err.reason == MERGE_CONFLICT and err.status == 409
            assert err.paths == [f"{HOME}/shared.txt"]
            assert not sb.exists(f"{HOME}/b.txt")
            assert sb.download(f"{HOME}/shared.txt") == b"from a\n"

            # With overwrite b's changes win, the conflicts listed.
            res = sb.apply(b, overwrite=True)
            assert res.conflicts == [f"{HOME}/shared.txt"]
            assert sb.download(f"{HOME}/shared.txt") == b"from b\n"
            assert sb.download(f"{HOME}/b.txt") == b"only in b\n"

            # From a snapshot, and a tar of changes applied as it comes.
            a.write(f"{HOME}/from-snapshot.txt", "snap\n")
            # (a snapshot's changes are over its parent, the fork's capture: shared.txt
            # conflicts again, a.txt is the same change on both sides.)
            snap = a.snapshot(_name("apply"))
            with pytest.raises(Conflict) as exc:
                sb.apply(snap.ref)
            assert exc.value.paths == [f"{HOME}/shared.txt"]
            res = sb.apply(snap.ref, overwrite=True)
            assert res.conflicts == [f"{HOME}/shared.txt"]
            assert sb.download(f"{HOME}/from-snapshot.txt") == b"snap\n"
            assert sb.download(f"{HOME}/shared.txt") == b"from a\n"
            a.remove(f"{HOME}/a.txt")
            res = sb.apply_tar(a.diff_tar(snap))
            assert res.whiteouts == 1 and not sb.exists(f"{HOME}/a.txt")

            with pytest.raises(InvalidArgument):
                sb.apply(sb)
            with pytest.raises(InvalidArgument):
                sb.apply(42)  # type: ignore[arg-type]
        client.delete_snapshot(snap)


def test_pause_and_resume(client: Berth) -> None:
    with client.create() as sb:
        pid = sb.start_process(["sleep", "300"])
        info = sb.pause()
        assert info.state == "paused" and sb.info.state == "paused"
        assert client.get(sb.id).info.state == "paused"
        with pytest.raises(Conflict) as exc:
            sb.exec("echo hi")
        assert "paused" in exc.value.message
        with pytest.raises(Conflict):
            sb.write(f"{HOME}/x.txt", "x")
        # A paused sandbox can still be snapshotted and forked.
        forks = sb.fork(1)
        with _deleting(*forks):
            assert forks[0].exec("echo copy").stdout == "copy\n"
        assert sb.resume().state == "running"
        assert sb.exec("echo again").stdout == "again\n"
        assert sb.get_process(pid).running
        # Resuming a running sandbox (pausing a paused one) changes nothing;
        # a stopped sandbox cannot be paused.
        assert sb.resume().state == "running"
        sb.stop()
        with pytest.raises(Conflict) as exc:
            sb.pause()
        assert "stopped" in exc.value.message


def test_pause_with_memory(client: Berth) -> None:
    with client.create(runtime="gvisor") as sb:
        pid = sb.start_process(["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done"])
        sb.exec("sleep 0.3")
        info = sb.pause(memory=True)
        assert info.state == "paused" and info.raw["checkpointed"]
        with pytest.raises(Conflict):
            sb.exec("echo hi")
        assert not sb.resume().raw.get("checkpointed")
        assert sb.get_process(pid).running
        first = int(sb.exec("cat /tmp/n").stdout)
        assert first >= 1 and int(sb.exec("sleep 0.3; cat /tmp/n").stdout) > first
    with client.create(runtime="native") as sb, pytest.raises(NotImplementedByRuntime) as exc:
        sb.pause(memory=True)
    assert "memory" in exc.value.message


async def _pause_memory_async(url: str) -> None:
    async with AsyncBerth(url) as c, await c.create(runtime="gvisor") as sb:
        await sb.upload("/tmp/f", b"kept")
        assert (await sb.pause(memory=True)).raw["checkpointed"]
        assert (await sb.resume()).state == "running"
        assert await sb.download("/tmp/f") == b"kept"


def test_pause_with_memory_async(berth_url: str) -> None:
    asyncio.run(_pause_memory_async(berth_url))


def test_a_snapshot_in_use_is_not_deleted(client: Berth) -> None:
    name = _name("in-use")
    with client.create() as sb:
        sb.write(f"{HOME}/f.txt", "f\n")
        snap = sb.snapshot(name)
    copy = client.create(image=snap.ref)
    with copy:
        with pytest.raises(Conflict) as exc:
            client.delete_snapshot(name)
        assert exc.value.error_class == "conflict" and copy.id in exc.value.message
        assert client.get_snapshot(name).in_use == [copy.id]
    client.delete_snapshot(name)
    assert name not in [s.name for s in client.list_snapshots()]


def test_async_snapshots_forks_diff_apply_pause(berth_url: str) -> None:
    async def run() -> None:
        async with AsyncBerth(berth_url) as c, await c.create() as sb:
            await sb.upload(f"{HOME}/a.txt", "async\n")
            name = _name("async")
            snap = await sb.snapshot(name, labels={"suite": "sdk-async"})
            assert snap.name == name and [s.name for s in await c.list_snapshots(selector="suite=sdk-async")] == [name]
            async with await c.create(image=snap) as made:
                assert await made.download(f"{HOME}/a.txt") == b"async\n"
                assert (await c.get_snapshot(name)).in_use == [made.id]
                with pytest.raises(Conflict):
                    await c.delete_snapshot(name)

            forks = await sb.fork(3, labels={"async": "yes"})
            try:
                assert len(forks) == 3 and forks.snapshot
                for f in forks:
                    assert f.info.labels == {"async": "yes", "berth.fork_of": sb.id}
                    assert await f.download(f"{HOME}/a.txt") == b"async\n"
                    assert await f.list_processes() == []
                one, two = forks[0], forks[1]
                await one.upload(f"{HOME}/a.txt", "one\n")
                await two.upload(f"{HOME}/a.txt", "two\n")
                await one.upload(f"{HOME}/new.txt", "new\n")

                d = await one.diff()
                assert {c.path: c.kind for c in d.changes} == {f"{HOME}/a.txt": "modified", f"{HOME}/new.txt": "added"}
                assert "+one\n" in await one.diff_patch() and "-async\n" in await one.diff_patch()
                await one.fs("remove", path=f"{HOME}/new.txt")
                await one.fs("remove", path=f"{HOME}/a.txt")
                assert "home/user/.wh.a.txt" in _tar_names(await one.diff_tar())
                await one.upload(f"{HOME}/a.txt", "one\n")

                res = await sb.apply(one)
                assert [c.path for c in res.changes] == [f"{HOME}/a.txt"]
                with pytest.raises(Conflict) as exc:
                    await sb.apply(two)
                assert exc.value.reason == MERGE_CONFLICT and exc.value.paths == [f"{HOME}/a.txt"]
                res = await sb.apply(two, overwrite=True)
                assert res.conflicts == [f"{HOME}/a.txt"]
                assert await sb.download(f"{HOME}/a.txt") == b"two\n"
            finally:
                for f in forks:
                    await f.delete()

            assert (await sb.pause()).state == "paused"
            with pytest.raises(Conflict):
                await sb.exec("true")
            assert (await sb.refresh()).state == "paused"
            assert (await sb.resume()).state == "running"
            assert (await sb.exec("echo thawed")).stdout == "thawed\n"
            await c.delete_snapshot(name)
            with pytest.raises(NotFound):
                await c.get_snapshot(name)

    asyncio.run(run())


def test_deepagents_backend_forks(sync_client: Berth) -> None:
    client = sync_client
    with client.create() as sb:
        backend = BerthSandbox(sandbox=sb, timeout=60)
        assert backend.write(f"{HOME}/plan.md", "step 1\n").error is None
        branches = backend.fork(2, labels=[{"try": "a"}, {"try": "b"}])
        try:
            assert [type(b) for b in branches] == [BerthSandbox, BerthSandbox]
            assert len({b.id for b in branches} | {backend.id}) == 3
            for b in branches:
                assert b.sandbox.info.labels["berth.fork_of"] == sb.id
                assert b.execute(f"cat {HOME}/plan.md").output == "step 1\n"
                assert b._timeout == 60
            assert branches[0].edit(f"{HOME}/plan.md", "step 1", "step 1 (a)").error is None
            assert branches[1].execute(f"echo try-b >> {HOME}/plan.md").exit_code == 0
            assert "step 1 (a)" in branches[0].read(f"{HOME}/plan.md").file_data["content"]
            assert branches[1].execute(f"cat {HOME}/plan.md").output == "step 1\ntry-b\n"
            assert backend.execute(f"cat {HOME}/plan.md").output == "step 1\n"
            # The winner goes back onto the original.
            backend.sandbox.apply(branches[0].sandbox)
            assert backend.execute(f"cat {HOME}/plan.md").output == "step 1 (a)\n"

            more = asyncio.run(backend.afork(1))
            try:
                assert more[0].execute(f"cat {HOME}/plan.md").output == "step 1 (a)\n"
            finally:
                more[0].sandbox.delete()
        finally:
            for b in branches:
                b.sandbox.delete()
