"""I/O faults: one line, exit code 2, nothing lost.

Unreadable inputs and checkpoints, a file expected where a folder is, read-only and uncreatable
output folders, FIFOs and devices given as data, output folders attnaudit did not write, two
processes on one folder, and a full disk during an audit and during training.

Permission faults need a process that file modes apply to; the tests run as root, which
ignores them, so the CLI is started as root *without* the capabilities that bypass file modes
(``setpriv --bounding-set=-dac_override,-dac_read_search``), or as is when not root. A full
disk is simulated in-process: committing a file (``os.replace``) or writing a safetensors file
fails with ``ENOSPC``, as it does on a full file system.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors import SafetensorError
from safetensors.torch import load_file

from attnaudit.audit import audit
from attnaudit.errors import AttnAuditError, InputError
from attnaudit.io import LOCK, check_output_dir, locked, open_input, read_input, read_json
from attnaudit.progress import set_quiet
from attnaudit.run import Run
from attnaudit.training.trainer import train

from .helpers import CLI, TINY_TRAIN, assert_clean_failure, cli, comparable, synthetic_rows, write_table

set_quiet(True)
NO_BYPASS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
FAST_TESTS = ["--only", "importance,permutation", "--set", "importance.methods=gradient", "--set", "permutation.permutations=5"]
FAST_OPTIONS = {"importance": {"methods": ["gradient"]}, "permutation": {"permutations": 5}}


def main_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: object) -> subprocess.CompletedProcess[str]:
    """``attnaudit ARGS`` through ``cli.main`` in this process (so monkeypatched faults apply)."""
    from attnaudit import cli as cli_module

    monkeypatch.setattr(sys, "argv", ["attnaudit", *map(str, args)])
    capsys.readouterr()  # only this command's output
    code = 0
    try:
        cli_module.main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        set_quiet(True)  # a command without --quiet turned status lines on for the whole process
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


@pytest.fixture(scope="module")
def unprivileged(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The command prefix of a process that file modes apply to; skips when there is none."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv is not installed: file modes cannot be tested")
    folder = tmp_path_factory.mktemp("probe")
    (folder / "open").write_text("x")
    (folder / "closed").write_text("x")
    (folder / "closed").chmod(0)
    can_read = subprocess.run([*NO_BYPASS, "cat", str(folder / "open")], capture_output=True).returncode == 0
    bypasses = subprocess.run([*NO_BYPASS, "cat", str(folder / "closed")], capture_output=True).returncode == 0
    if not can_read or bypasses:
        pytest.skip("cannot start a root process without the capabilities that bypass file modes")
    return NO_BYPASS


def cli_as(prefix: list[str], *args: object) -> subprocess.CompletedProcess[str]:
    """``attnaudit ARGS`` in a fresh process started through ``prefix``."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    environment.pop("ATTNAUDIT_DATA", None)
    return subprocess.run([*prefix, *CLI, *map(str, args)], capture_output=True, text=True, env=environment, timeout=600)


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (to show nothing was changed)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- unreadable, misplaced and special inputs


def test_unreadable_data_file_and_checkpoint(unprivileged: list[str], run_copy: Path, tmp_path: Path) -> None:
    data = write_table(tmp_path / "train.csv", synthetic_rows(40))
    data.chmod(0)
    out = tmp_path / "out"
    error = assert_clean_failure(cli_as(unprivileged, "train", "--task", f"csv:{data}", "--out", out, *TINY_TRAIN), str(data), out=out)
    assert "permission denied" in error and not out.exists()
    for name in ("model.safetensors", "config.json", "vocab.json"):
        (run_copy / name).chmod(0)
        error = assert_clean_failure(cli_as(unprivileged, "evaluate", run_copy, "--quiet"), str(run_copy / name))
        assert "permission denied" in error
        (run_copy / name).chmod(0o644)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_run_file_that_is_a_directory(name: str, run_copy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (run_copy / name).unlink()
    (run_copy / name).mkdir()
    error = assert_clean_failure(main_in_process(monkeypatch, capsys, "evaluate", run_copy, "--quiet"), str(run_copy / name))
    assert "is a directory" in error


def test_fifo_and_device_are_refused_as_data(tmp_path: Path) -> None:
    fifo = tmp_path / "train.csv"
    os.mkfifo(fifo)  # nothing ever writes to it: reading it would wait forever
    out = tmp_path / "out"
    try:
        proc = subprocess.run([*CLI, "train", "--task", f"csv:{fifo}", "--out", out, *TINY_TRAIN],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail("a FIFO given as data blocked the command")
    assert "not a regular file" in assert_clean_failure(proc, str(fifo), out=out)
    good = write_table(tmp_path / "good.csv", synthetic_rows(40))
    error = assert_clean_failure(cli("train", "--task", f"csv:{good}", "--test", "csv:/dev/zero", "--out", out, *TINY_TRAIN), "/dev/zero")
    assert "not a regular file" in error and not out.exists()


def test_reads_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Special files fail before any read; a line or JSON file over the bound fails instead of filling memory."""
    from attnaudit.data import readers

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    for path, message in ((fifo, "not a regular file"), (Path("/dev/zero"), "not a regular file"), (tmp_path, "is a directory")):
        with pytest.raises(InputError, match=message):
            open_input(path)
    with pytest.raises(InputError, match="not a regular file"):
        read_json(fifo)
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 100)
    long_line = tmp_path / "long.csv"
    long_line.write_text("text,label\n" + "word " * 50 + ",positive\n")
    with pytest.raises(InputError, match=r"long\.csv:2: line longer than"):
        readers.read_text_lines(long_line)
    with pytest.raises(InputError, match="larger than"):
        read_input(long_line, limit=100)


# --------------------------------------------------------------------------- output folders


def test_read_only_run_directory(unprivileged: list[str], run_copy: Path) -> None:
    before = tree(run_copy)
    run_copy.chmod(0o555)
    try:
        error = assert_clean_failure(cli_as(unprivileged, "run", "importance", run_copy, "--limit", "5", "--quiet"), str(run_copy))
        assert "cannot write here" in error
        error = assert_clean_failure(cli_as(unprivileged, "train", "--task", "synthetic", "--out", run_copy, *TINY_TRAIN), str(run_copy))
        assert "cannot write here" in error
    finally:
        run_copy.chmod(0o755)
    assert tree(run_copy) == before


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
def test_output_folder_that_cannot_be_created(run_copy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["train", "--task", "synthetic", "--out", "/proc/x", *TINY_TRAIN],
                 ["run", "importance", run_copy, "--out", "/proc/x", "--quiet"],
                 ["audit", "--run", run_copy, "--out", "/proc/x", "--quiet"]):
        error = assert_clean_failure(main_in_process(monkeypatch, capsys, *args), "/proc/x")
        assert "cannot create the output folder" in error or "cannot write here" in error  # as root / as a user


def test_output_folder_attnaudit_did_not_write(trained: Run, run_copy: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    (home / "run").mkdir(parents=True)  # a folder named like ours does not make it ours (`/` has a run/)
    (home / "notes.txt").write_text("keep me")
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "config.json").write_text('{"editor": "vim"}')  # another program's config
    (tool / "metrics.json").write_text("{}")
    before = {folder: tree(folder) for folder in (home, tool)}
    for folder, names, message in ((home, home, "not an attnaudit run or audit folder"),
                                   (tool, tool / "config.json", "not an attnaudit run config")):
        for args in (["train", "--task", "synthetic", "--out", folder, *TINY_TRAIN],
                     ["run", "importance", run_copy, "--out", folder, "--quiet"],
                     ["audit", "--run", run_copy, "--out", folder, "--quiet"],
                     ["report", folder]):
            error = assert_clean_failure(main_in_process(monkeypatch, capsys, *args), str(names))
            assert message in error, error
        assert tree(folder) == before[folder]
    with pytest.raises(AttnAuditError, match="not an attnaudit run or audit folder"):
        check_output_dir("/")
    # what attnaudit wrote stays writable: a run, an audit, a `run --out` folder, an empty folder
    results = tmp_path / "mine"
    results.mkdir()
    (results / "importance.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    killed = tmp_path / "roar-out"  # `run roar --out` killed during its first retrain: a nested sub-run's epoch checkpoint
    (killed / "subruns" / "roar" / "seed-0" / "all" / "ratio-100" / "checkpoint").mkdir(parents=True)
    (killed / "subruns" / "roar" / "seed-0" / "all" / "ratio-100" / "checkpoint" / "state.json").write_text("{}")
    for folder in (Path(trained.path), results, tmp_path / "empty", tmp_path / "new" / "deeper", killed):
        assert check_output_dir(folder) == folder
    (killed / "subruns" / "roar" / "seed-0" / "all" / "ratio-100" / "checkpoint" / "state.json").unlink()
    with pytest.raises(AttnAuditError, match="not an attnaudit run or audit folder"):
        check_output_dir(killed)  # empty folders named like ours are not enough


# --------------------------------------------------------------------------- two processes on one folder


def test_second_process_on_the_same_folder_is_refused(run_copy: Path, tmp_path: Path) -> None:
    hold = "import sys\nfrom attnaudit.io import locked\nwith locked(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run_copy)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        in_use = f"{run_copy} is in use by another attnaudit process (pid {holder.pid})"
        before = tree(run_copy)
        assert_clean_failure(cli("run", "importance", run_copy, "--limit", "5", "--quiet"), in_use)
        assert_clean_failure(cli("train", "--task", "synthetic", "--out", run_copy, *TINY_TRAIN), in_use)
        assert tree(run_copy) == before
        with pytest.raises(AttnAuditError, match=f"in use by another attnaudit process \\(pid {holder.pid}\\)"):
            audit(run_copy, run=run_copy, only=["importance"], limit=5)
    finally:
        holder.send_signal(signal.SIGKILL)  # a killed holder leaves no stale lock: the kernel drops it
        holder.wait()
    proc = cli("run", "importance", run_copy, "--limit", "5", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert (run_copy / "results" / "importance.json").exists()


def test_a_finished_run_loads_while_another_process_holds_its_lock(tmp_path: Path) -> None:
    """Readers never exclude each other (Ray workers load one seed's 0 % model at once): ``train`` with the finished
    run's own config loads it while another process holds the folder; another config, which would write, is refused."""
    from attnaudit.progress import set_quiet

    set_quiet(True)
    options = {"epochs": 1, "embed_dim": 8, "hidden_dim": 8, "quiet_eval": True}
    out = tmp_path / "run"
    train("synthetic", "bilstm", out, **options)
    hold = "import sys\nfrom attnaudit.io import locked\nwith locked(sys.argv[1]):\n    print('held', flush=True)\n    sys.stdin.read()\n"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = tree(out)
        assert train("synthetic", "bilstm", out, **options).path == out
        with pytest.raises(AttnAuditError, match=f"in use by another attnaudit process \\(pid {holder.pid}\\)"):
            train("synthetic", "bilstm", out, **{**options, "epochs": 2})
        assert tree(out) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_lock_nests_within_a_process_and_leaves_no_trace_on_failure(tmp_path: Path) -> None:
    with locked(tmp_path / "audit") as outer, locked(outer / "results"), locked(outer):
        assert (outer / LOCK).exists() and not (outer / "results" / LOCK).exists()
    assert not (tmp_path / "audit").exists()  # created for the lock and left empty: removed again
    with pytest.raises(AttnAuditError, match="--epochs must be at least 1"):
        train("synthetic", "bilstm", tmp_path / "run", epochs=0)
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- a full disk


def fill_disk(monkeypatch: pytest.MonkeyPatch, folder: Path, when: Callable[[Path], bool] = lambda path: True) -> None:
    """From now on, committing a file under ``folder`` for which ``when(path)`` holds fails with ENOSPC."""
    real = os.replace

    def replace(src: str | Path, dst: str | Path, *args: object, **kwargs: object) -> None:
        if folder in Path(dst).parents and when(Path(dst)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src))
        real(src, dst, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", replace)


def leftovers(folder: Path) -> list[Path]:
    """Temporary files an atomic write left behind (none may be)."""
    return list(folder.rglob("*.tmp"))


def test_full_disk_during_audit_keeps_results_and_report(run_copy: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "audit"
    audit(out, run=run_copy, only=["importance"], limit=10, figures=False, test_options=FAST_OPTIONS)
    before = tree(out)
    with monkeypatch.context() as patch:
        fill_disk(patch, out)
        proc = main_in_process(patch, capsys, "audit", "--run", run_copy, "--out", out, "--limit", "10", "--no-figures", "--quiet", *FAST_TESTS)
    error = assert_clean_failure(proc, str(out / "results" / "permutation"))
    assert "no space left on device" in error and "test 'permutation' was lost" in error
    assert tree(out) == before and leftovers(out) == []  # the finished result and the report so far are whole
    resumed = audit(out, run=run_copy, limit=10, figures=False, test_options=FAST_OPTIONS, only=["importance", "permutation"])
    log = {entry["test"]: entry["status"] for entry in read_json(out / "audit.json")["tests"]}
    assert log == {"importance": "cached", "permutation": "done"} and resumed.ok


def test_full_disk_for_one_result_still_writes_the_report(run_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "audit"
    fill_disk(monkeypatch, out, lambda path: path.name.startswith("permutation"))
    with pytest.raises(AttnAuditError, match="test 'permutation' was lost .* the report was updated"):
        audit(out, run=run_copy, only=["importance", "permutation"], limit=10, figures=False, test_options=FAST_OPTIONS)
    entries = {entry["test"]: entry for entry in read_json(out / "audit.json")["tests"]}
    assert entries["importance"]["status"] == "done" and (out / "results" / "importance.json").exists()
    assert entries["permutation"]["status"] == "failed" and "no space left on device" in entries["permutation"]["error"]
    assert "permutation" in (out / "report.html").read_text() and leftovers(out) == []


def test_full_disk_during_training_keeps_the_last_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The optimizer state of epoch 2 cannot be written: epoch 1's checkpoint stays whole and
    consistent, and the resumed run ends exactly where an uninterrupted one does."""
    import attnaudit.weights as weights

    data = write_table(tmp_path / "train.csv", synthetic_rows(120))
    args = ["train", "--task", f"csv:{data}", *TINY_TRAIN[:2], "--epochs", "2", *TINY_TRAIN[4:]]
    assert main_in_process(monkeypatch, capsys, *args, "--out", tmp_path / "full").returncode == 0
    real, calls = weights.save_file, []

    def save_file(tensors: dict, path: str, metadata: dict | None = None) -> None:
        calls.append(path)
        if metadata and "optimizer" in metadata and sum(1 for c in calls if "optimizer" in Path(c).name) == 2:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        real(tensors, path, metadata=metadata)

    with monkeypatch.context() as patch:
        patch.setattr(weights, "save_file", save_file)
        proc = main_in_process(patch, capsys, *args, "--out", tmp_path / "cut")
    error = assert_clean_failure(proc, str(tmp_path / "cut" / ".partial" / "checkpoint"))
    assert "no space left on device" in error and f"{tmp_path / 'cut'} is unchanged" in error
    assert json.loads((tmp_path / "cut" / ".partial" / "checkpoint" / "state.json").read_text())["epoch"] == 1
    assert not (tmp_path / "cut" / "metrics.json").exists() and leftovers(tmp_path / "cut") == []
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == [".partial"]  # no half run: the run is built apart
    assert main_in_process(monkeypatch, capsys, *args, "--out", tmp_path / "cut").returncode == 0  # resumes after epoch 1
    full, resumed = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert all(full[k].equal(resumed[k]) for k in full)
    metrics = [comparable(read_json(tmp_path / run / "metrics.json")) for run in ("full", "cut")]
    assert metrics[0] == metrics[1]

