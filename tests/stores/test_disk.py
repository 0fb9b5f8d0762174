import logging
import os
import resource
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
import torch

from vlcache.stores import open_store
from vlcache.stores.disk import STALE_TMP_S, DiskStore

MODEL = "qwen2@" + "11" * 32


def test_roundtrip_and_restart(tmp_path, entry, same):
    store = DiskStore(tmp_path, model=MODEL)
    store.put("img-a", entry)
    assert same(store.get("img-a"), entry) and store.contains("img-a")
    reopened = open_store(f"disk://{tmp_path}", model=MODEL)
    assert same(reopened.get("img-a"), entry) and list(reopened.keys()) == ["img-a"]
    assert reopened.nbytes == (tmp_path / "img-a.vlc").stat().st_size
    assert reopened.delete("img-a") and reopened.get("img-a") is None


def _damage(path: Path, how: str) -> None:
    blob = bytearray(path.read_bytes())
    if how == "truncate":
        blob = blob[: len(blob) * 2 // 3]
    else:
        blob[len(blob) // 2] ^= 0x01
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("how", ["truncate", "bitflip"])
def test_damaged_entry_is_a_miss_removed_and_logged_once(tmp_path, make_entry, caplog, how):
    caplog.set_level(logging.DEBUG, logger="vlcache.stores")
    store = DiskStore(tmp_path)
    for k in ("img-a", "img-b"):
        store.put(k, make_entry())
        _damage(tmp_path / f"{k}.vlc", how)
    assert store.get("img-a") is None and store.get("img-b") is None
    assert not (tmp_path / "img-a.vlc").exists() and not (tmp_path / "img-b.vlc").exists()
    assert store.stats.corrupt == 2 and store.stats.hits == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "rejected img-a.vlc" in warnings[0].getMessage()
    store.put("img-a", make_entry())  # recomputed and stored again
    assert store.get("img-a") is not None


def test_entry_of_another_model_or_kv_dtype_is_rejected(tmp_path, entry):
    DiskStore(tmp_path, model=MODEL, kv_dtype="bf16").put("img-a", entry)
    DiskStore(tmp_path, model=MODEL, kv_dtype="bf16").put("img-b", entry)
    other_model = DiskStore(tmp_path, model="qwen2@" + "22" * 32, kv_dtype="bf16")
    assert other_model.get("img-a") is None and other_model.stats.corrupt == 1
    other_dtype = DiskStore(tmp_path, model=MODEL, kv_dtype="fp16")
    assert other_dtype.get("img-b") is None and not other_dtype.contains("img-b")


def test_file_renamed_to_another_key_is_rejected(tmp_path, entry):
    store = DiskStore(tmp_path)
    store.put("img-a", entry)
    shutil.copy(tmp_path / "img-a.vlc", tmp_path / "img-b.vlc")
    assert store.get("img-b") is None and store.get("img-a") is not None


def test_size_cap_evicts_least_recently_used(tmp_path, make_entry):
    size = len(Path(_one_file(tmp_path / "probe", make_entry())).read_bytes())
    store = DiskStore(tmp_path / "c", max_bytes=int(3.5 * size))
    for k in "abc":
        store.put(f"img-{k}", make_entry())
        time.sleep(0.01)
    assert store.get("img-a") is not None  # touched: b is now the least recently used
    time.sleep(0.01)
    store.put("img-d", make_entry())
    assert sorted(store.keys()) == ["img-a", "img-c", "img-d"]
    assert store.stats.evictions == 1 and store.nbytes <= store.max_bytes


def _one_file(root: Path, entry) -> Path:
    DiskStore(root).put("img-x", entry)
    return root / "img-x.vlc"


def _stalled_put(say, root: Path, entry) -> None:
    def half_write(self, f, blob: bytes) -> None:
        f.write(blob[: len(blob) // 2])
        f.flush()
        say("stalled")
        time.sleep(600)

    DiskStore._write = half_write  # in the child only: its temp file is half written
    DiskStore(root).put("img-k", entry)


def test_kill_mid_put_never_exposes_a_partial_entry(tmp_path, make_entry, same, fork):
    old = make_entry()
    DiskStore(tmp_path).put("img-k", old)
    child = fork(_stalled_put, tmp_path, make_entry(n=500))
    assert child.recv() == "stalled"
    child.kill()
    partial = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(partial) == 1 and partial[0].stat().st_size > 0  # it died mid-write
    store = DiskStore(tmp_path)
    assert same(store.get("img-k"), old) and list(store.keys()) == ["img-k"]
    old_time = time.time() - STALE_TMP_S - 1
    os.utime(partial[0], (old_time, old_time))
    DiskStore(tmp_path)  # opening recounts the directory and clears a dead writer's leftovers
    assert not partial[0].exists()


def _put_then_get(say, root: Path, entry, fsize_limit: int | None = None) -> dict:
    if os.geteuid() == 0 and fsize_limit is None:
        os.setuid(65534)  # root ignores file modes: become nobody, held to them
    if fsize_limit is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))
    store = DiskStore(root)
    store.put("img-new", entry)
    existing = store.get("img-existing")
    return {
        "hit": store.get("img-new") is not None,
        "existing": existing is not None and bool((existing.embeds == 1.0).all()),
        "stats": store.stats.as_dict(),
    }


def test_permission_denied_put_is_a_logged_no_op(make_entry, fork):
    root = Path(tempfile.mkdtemp(prefix="vlcache-ro-"))  # outside pytest's private tmp dirs
    try:
        DiskStore(root).put("img-existing", make_entry(fill=1.0))
        os.chmod(root, 0o755 if os.geteuid() == 0 else 0o555)  # root: the child becomes nobody
        result, logs = fork(_put_then_get, root, make_entry()).result()
        assert result["existing"] and not result["hit"]  # gets still work
        assert result["stats"]["errors"] == 1 and result["stats"]["puts"] == 0
        assert "put img-new skipped" in logs and "Permission denied" in logs
        assert sorted(p.name for p in root.iterdir()) == ["img-existing.vlc"]
    finally:
        os.chmod(root, 0o755)
        shutil.rmtree(root)


def test_disk_full_put_is_a_logged_no_op(tmp_path, make_entry, fork):
    DiskStore(tmp_path).put("img-existing", make_entry(fill=1.0))
    # RLIMIT_FSIZE makes the write fail as a full disk does: an OSError half-way through
    result, logs = fork(_put_then_get, tmp_path, make_entry(n=2000), 100_000).result()
    assert result["existing"] and not result["hit"] and result["stats"]["errors"] == 1
    assert "put img-new skipped" in logs and "File too large" in logs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img-existing.vlc"]  # no temp left


def test_keys_must_be_file_safe(tmp_path, entry):
    with pytest.raises(ValueError, match="disk store keys"):
        DiskStore(tmp_path).put("../escape", entry)


def test_kv_dtype_bf16_halves_the_kv_on_disk(tmp_path, entry):
    full = _one_file(tmp_path / "full", entry).stat().st_size
    store = DiskStore(tmp_path / "half", kv_dtype="bf16")
    store.put("img-x", entry)
    assert store.get("img-x").keys.dtype == torch.bfloat16
    kv = entry.keys.nbytes + entry.values.nbytes
    assert full - store.nbytes == pytest.approx(kv // 2, abs=64)  # header text differs a little
