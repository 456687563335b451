"""load_task: specs, seeded splits, notes, errors, and the named datasets' real sizes."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from attnaudit.data import tasks
from attnaudit.data.tasks import list_tasks, load_task, register_task
from attnaudit.data.types import TaskData
from attnaudit.errors import AttnAuditError, AttnAuditWarning, InputError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def csv_rows(n: int, labels: tuple[str, ...] = ("a", "b")) -> str:
    return "text,label\n" + "".join(f"word{i} text,{labels[i % len(labels)]}\n" for i in range(n))


@pytest.fixture
def no_env_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide the user's $ATTNAUDIT_DATA (not autouse: the shared_data fixture reads it)."""
    monkeypatch.delenv(tasks.DATA_ENV, raising=False)


def test_list_tasks_names_every_dataset_with_a_description() -> None:
    names = dict(list_tasks())
    assert set(names) >= {
        "conll2000", "sst", "sst-trees", "sst2", "agnews", "snli",
        "babi1", "babi2", "babi3", "synthetic", "synthetic-tagging",
    }
    assert all(desc for desc in names.values())
    assert [n for n, _ in list_tasks()] == sorted(names)


def test_every_named_dataset_says_which_data_folder_it_reads(shared_data: Path, tmp_path: Path) -> None:
    assert tasks.task_folder("synthetic") is None and tasks.task_folder("conll2000") == "conll2000"
    for name, _ in list_tasks():
        folder = tasks.task_folder(name)
        if folder is None:
            continue
        assert (shared_data / folder).is_dir(), (name, folder)
        # a data directory holding everything but that folder: the task must fail to find its files
        without = tmp_path / f"without-{name}"
        without.mkdir()
        top = folder.split("/")[0]
        for entry in shared_data.iterdir():
            if entry.name != top:
                (without / entry.name).symlink_to(entry)
        with pytest.raises(AttnAuditError, match="not found"):
            load_task(name, data_dir=without)


def test_register_task_adds_a_loader_and_refuses_duplicates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "_REGISTRY", dict(tasks._REGISTRY))
    monkeypatch.setattr(tasks, "_FOLDERS", dict(tasks._FOLDERS))

    @register_task("tiny", "a test task")
    def tiny(data_dir: Path | None, seed: int) -> TaskData:
        return tasks.synthetic_task("classification", seed, n_train=4, n_dev=2, n_test=2)

    assert ("tiny", "a test task") in list_tasks()
    assert len(load_task("tiny").train) == 4
    with pytest.raises(ValueError, match="registered twice"):
        register_task("tiny", "again")(tiny)


def test_synthetic_tasks_need_no_data_dir() -> None:
    task = load_task("synthetic", seed=5, limit=7)
    assert (len(task.train), len(task.dev), len(task.test)) == (7, 7, 7)
    assert task.train == load_task("synthetic", seed=5).train[:7]
    assert any("limited to the first 7" in note for note in task.notes)
    assert load_task("synthetic-tagging").task_type == "tagging"


@pytest.mark.usefixtures("no_env_data_dir")
def test_named_task_without_data_dir_says_how_to_give_one() -> None:
    expected = r"^no data directory: pass --data-dir or set ATTNAUDIT_DATA \(needed for task 'sst'\)$"
    with pytest.raises(AttnAuditError, match=expected):
        load_task("sst")


def test_missing_data_dir_or_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(AttnAuditError, match="data directory not found: .*nowhere"):
        load_task("sst", data_dir=tmp_path / "nowhere")
    monkeypatch.setenv(tasks.DATA_ENV, str(tmp_path))
    with pytest.raises(AttnAuditError, match=r"sst/sst_dataset\.csv: not found \(task 'sst' reads"):
        load_task("sst")


def test_unknown_spec_lists_the_choices() -> None:
    expected = "unknown task 'imdb': use a task name .*sst2.*FORMAT one of conll, csv"
    with pytest.raises(AttnAuditError, match=expected):
        load_task("imdb")
    with pytest.raises(AttnAuditError, match="missing path"):
        load_task("csv:")
    with pytest.raises(AttnAuditError, match="unknown option.*colour; allowed: header, label, query, text"):
        load_task("csv:x.csv?colour=red")


def test_csv_file_is_split_with_the_seed_and_says_so(tmp_path: Path) -> None:
    path = write(tmp_path / "reviews.csv", csv_rows(50))
    task = load_task(f"csv:{path}", seed=1)
    assert (task.name, task.task_type, task.labels) == ("reviews", "classification", ["a", "b"])
    assert (len(task.train), len(task.dev), len(task.test)) == (40, 5, 5)
    assert any("dev and test = 10%" in note and "seed 1" in note for note in task.notes)
    sources = [e.meta["source"] for e in task.train + task.dev + task.test]
    assert len(set(sources)) == 50
    assert load_task(f"csv:{path}", seed=1).dev == task.dev
    assert load_task(f"csv:{path}", seed=2).dev != task.dev


def test_dev_and_test_files_are_used_when_given(tmp_path: Path) -> None:
    train = write(tmp_path / "train.tsv", "sentence\tlab\n" + "good one\tp\nbad one\tn\n" * 5)
    dev = write(tmp_path / "dev.jsonl", '{"text": "ok", "label": "p"}\n')
    test = write(tmp_path / "test.csv", "text,label\nmeh,n\n")
    task = load_task(f"tsv:{train}?text=sentence&label=lab", dev=f"jsonl:{dev}", test=f"csv:{test}")
    assert (len(task.train), len(task.dev), len(task.test)) == (10, 1, 1)
    assert not any("split off" in note for note in task.notes)
    only_dev = load_task(f"tsv:{train}?text=sentence&label=lab", dev=f"jsonl:{dev}")
    assert (len(only_dev.train), len(only_dev.test)) == (9, 1)
    assert any(note.startswith("test = 10%") for note in only_dev.notes)


def test_labels_only_in_test_are_kept_with_a_warning(tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", csv_rows(10))
    test = write(tmp_path / "test.csv", "text,label\nnew,c\n")
    with pytest.warns(AttnAuditWarning, match="labels c occur in dev/test but not in training data"):
        task = load_task(f"csv:{train}", test=f"csv:{test}")
    assert task.labels == ["a", "b", "c"]


def test_header_less_csv_with_query_is_a_pair_task(tmp_path: Path) -> None:
    path = write(tmp_path / "pairs.csv", "".join(f"p{i},h{i},yes\n" for i in range(20)))
    task = load_task(f"csv:{path}?header=0&text=0&query=1&label=2")
    assert task.task_type == "pair" and task.train[0].query is not None


def test_conll_sst_trees_babi_snli_and_plain_specs(tmp_path: Path) -> None:
    conll = write(tmp_path / "chunks.txt", "".join(f"w{i} NN B-NP\nx VB B-VP\n\n" for i in range(20)))
    tagging = load_task(f"conll:{conll}")
    assert tagging.task_type == "tagging" and tagging.labels == ["B-NP", "B-VP"]
    assert load_task(f"conll:{conll}?feature=none").train[0].meta.keys() == {"source"}

    trees = write(tmp_path / "trees.txt", "(4 (4 good) (2 film))\n(0 (0 bad) (2 film))\n" * 10)
    assert load_task(f"sst-trees:{trees}").labels == ["negative", "positive"]

    story = "1 Mary went to the hall.\n2 Where is Mary?\thall\t1\n" * 20
    babi = load_task(f"babi:{write(tmp_path / 'qa.txt', story)}")
    assert babi.task_type == "pair" and babi.labels == ["hall"]

    for split, n in (("dev", 30), ("test", 4)):
        write(tmp_path / "nli" / f"s1.{split}", "a man .\n" * n)
        write(tmp_path / "nli" / f"s2.{split}", "a person .\n" * n)
        write(tmp_path / "nli" / f"labels.{split}", "entailment\n" * n)
    snli = load_task(f"snli:{tmp_path / 'nli'}")
    assert (snli.name, len(snli.train), len(snli.dev), len(snli.test)) == ("nli", 27, 3, 4)
    assert any("training on its dev split" in note for note in snli.notes)

    pos = write(tmp_path / "pos.txt", "great\n" * 10)
    neg = write(tmp_path / "neg.txt", "awful\n" * 10)
    plain = load_task(f"plain:pos={pos},neg={neg}")
    assert plain.labels == ["neg", "pos"] and len(plain.train) == 16
    with pytest.raises(AttnAuditError, match="expected plain:LABEL=PATH"):
        load_task(f"plain:{pos}")


def test_reader_errors_reach_the_caller(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.csv", "text,label\nfine,a\nbroken\n")
    with pytest.raises(InputError, match=r"bad\.csv:3: expected 2 columns"):
        load_task(f"csv:{path}")
    with pytest.raises(InputError, match="file not found"):
        load_task(f"jsonl:{tmp_path / 'none.jsonl'}")
    with pytest.raises(AttnAuditError, match="too few examples"):
        load_task(f"csv:{write(tmp_path / 'one.csv', csv_rows(1))}")


def test_hf_spec_uses_validation_and_splits_off_a_missing_test(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def fake_load(path: str, name: str | None = None, split: str = "train") -> datasets.Dataset:
        if split == "test":
            raise ValueError('Unknown split "test". Should be one of [train, validation].')
        n = 40 if split == "train" else 6
        rows = {"text": [f"t {i}" for i in range(n)], "label": [i % 2 for i in range(n)]}
        return datasets.Dataset.from_dict(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    task = load_task("hf:user/data/main")
    assert task.name == "hf-user-data-main" and task.labels == ["0", "1"]
    assert (len(task.train), len(task.dev), len(task.test)) == (36, 6, 4)
    assert any("no usable 'test' split" in note for note in task.notes)


# --- real data (README sizes) -----------------------------------------------------------


def sizes(task: TaskData) -> tuple[int, int, int]:
    return len(task.train), len(task.dev), len(task.test)


@pytest.mark.data
def test_conll2000(shared_data: Path) -> None:
    task = load_task("conll2000", shared_data)
    assert len(task.train) + len(task.dev) == 8936 and len(task.test) == 2012
    assert len(task.dev) == 894 and task.task_type == "tagging"
    assert sum(len(e.tokens) for e in task.test) == 47377
    assert "B-NP" in task.labels and "I-LST" in task.labels  # I-LST occurs only in test
    assert task.train[0].meta["features"][:2] == ["NN", "IN"]


@pytest.mark.data
def test_sst_variants(shared_data: Path) -> None:
    assert sizes(load_task("sst", shared_data)) == (6920, 872, 1821)
    trees = load_task("sst-trees", shared_data)
    assert sizes(trees) == (6920, 872, 1821) and trees.labels == ["negative", "positive"]
    assert all(e.rationale is not None for e in trees.test)
    sst2 = load_task("sst2", shared_data)
    assert sizes(sst2) == (67349 - 872, 872, 872) and sst2.labels == ["negative", "positive"]
    assert any("no labelled test set" in note for note in sst2.notes)


@pytest.mark.data
def test_agnews_snli_babi(shared_data: Path) -> None:
    agnews = load_task("agnews", shared_data)
    assert sizes(agnews) == (6080, 760, 760)
    assert agnews.labels == ["Business", "Sci/Tech", "Sports", "World"]
    snli = load_task("snli", shared_data)
    assert sizes(snli) == (9842 - 984, 984, 9824) and snli.task_type == "pair"
    assert snli.labels == ["contradiction", "entailment", "neutral"]
    assert any("train = 90% of the SNLI dev set" in note for note in snli.notes)
    babi1 = load_task("babi1", shared_data)
    assert sizes(babi1) == (9000, 1000, 1000) and "en-10k" in babi1.notes[0]
    assert all(e.rationale for e in babi1.test)


@pytest.mark.data
def test_babi3_falls_back_to_en_and_named_tasks_do_not_warn(shared_data: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", AttnAuditWarning)
        babi3 = load_task("babi3", shared_data, seed=4)
        load_task("conll2000", shared_data)
    assert sizes(babi3) == (900, 100, 1000) and "(en)" in babi3.notes[0]


def test_hf_spec_options_and_given_splits(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import datasets

    asked: list[str] = []

    def fake_load(path: str, name: str | None = None, split: str = "train") -> datasets.Dataset:
        asked.append(split)
        return datasets.Dataset.from_dict({"body": ["x y"] * 20, "y": ["p", "n"] * 10})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    test = write(tmp_path / "test.csv", "text,label\nz,p\n")
    task = load_task("hf:imdb?text=body&label=y", test=f"csv:{test}")
    assert asked == ["train", "validation"] and task.test[0].tokens == ["z"]
    assert task.train[0].tokens == ["x", "y"] and task.labels == ["n", "p"]
    asked.clear()
    with pytest.warns(AttnAuditWarning, match="labels n occur in dev/test"):
        load_task(f"csv:{test}", dev="hf:imdb?text=body&label=y", test=f"csv:{test}")
    assert asked == ["validation"]


def test_bad_option_values(tmp_path: Path) -> None:
    path = write(tmp_path / "c.txt", "a B\n")
    with pytest.raises(AttnAuditError, match=r"option word='x': expected a column number"):
        load_task(f"conll:{path}?word=x")
    with pytest.raises(AttnAuditError, match=r"option header='maybe'"):
        load_task(f"csv:{path}?header=maybe")
