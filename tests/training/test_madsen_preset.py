"""Madsen et al. (2022)'s BiLSTM protocol as ``--preset madsen2022-sst`` / ``madsen2022-babi``: every setting
reaches the run's config and the loop (AMSGrad, no decay on the attention scorer for SST, decay everywhere for bAbI,
no clipping, every epoch trained, the best dev ROC-AUC / accuracy epoch kept), bAbI's model (32 units, their pair
head) a pair run, and SST's data handling (short sentences dropped, [CLS] … [EOS]
read but never weighed, a [MASK] word to mask with, the specials' rows starting at zero) reaches the vocabulary,
the model and ROAR's retrains."""

from __future__ import annotations

import json

import pytest
import torch

from attnaudit.data.synthetic import synthetic_task
from attnaudit.data.types import Example, TaskData
from attnaudit.experiments.roar import mask_token
from attnaudit.experiments.runner import run_test
from attnaudit.models import ModelConfig, build_model
from attnaudit.progress import set_quiet
from attnaudit.run import load_run
from attnaudit.training.trainer import PRESETS, TrainConfig, train

set_quiet(True)


@pytest.mark.parametrize(
    ("preset", "select", "epochs", "batch"), [("madsen2022-sst", "roc_auc", 8, 32), ("madsen2022-babi", "accuracy", 100, 50)]
)
def test_madsen_presets_reach_the_config_and_the_loop(tmp_path, preset: str, select: str, epochs: int, batch: int) -> None:
    data = synthetic_task("classification", seed=0, n_train=60, n_dev=20, n_test=20)
    assert PRESETS[preset]["epochs"] == epochs and PRESETS[preset]["batch_size"] == batch
    run = train(data, "bilstm", tmp_path / "run", preset=preset, epochs=2, hidden_dim=8, embed_dim=8, quiet_eval=True)
    model, settings = run.info["model"], run.info["train"]
    assert model["hidden_dim"] == 8 and model["scorer"] == "tanh" and model["dropout"] == 0.0
    assert settings["optimizer"] == "amsgrad" and settings["lr"] == 1e-3 and settings["weight_decay"] == 1e-5
    sst = preset == "madsen2022-sst"  # bAbI: their pair model decays every parameter, the attention too
    assert settings.get("no_decay", []) == (["scorer.*"] if sst else []) and settings["clip"] == 0.0 and settings["early_stop"] is False
    assert settings["select"] == select and settings["batch_size"] == batch and settings["preset"] == preset
    if preset == "madsen2022-babi":
        assert model["embed_dim"] == 8  # explicit options override the preset's 50
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and len(metrics["history"]) == 2  # every epoch trained
    kept = max(metrics["history"], key=lambda h: h["dev"][select])
    assert metrics["best_dev"] == pytest.approx(kept["dev"][select])
    loop = TrainConfig(**settings).loop("classification")
    groups = loop.optimiser.groups(run.model)
    exempt = {id(p) for group in groups if group["weight_decay"] == 0.0 for p in group["params"]}
    assert exempt == {id(p) for n, p in run.model.named_parameters() if sst and n.startswith("scorer.")}
    assert isinstance(loop.optimiser.build(run.model), torch.optim.Adam) and loop.optimiser.build(run.model).defaults["amsgrad"]


def test_madsen_sst_preset_handles_the_data_as_their_code_does(tmp_path) -> None:
    synthetic = synthetic_task("classification", seed=0, n_train=60, n_dev=20, n_test=20)
    short = [Example(tokens=["good", "film"], label=synthetic.train[0].label)] * 3  # 2 tokens: dropped, as theirs (len > 5)
    data = TaskData(synthetic.name, "classification", [*synthetic.train, *short], [*synthetic.dev, *short], synthetic.test,
                    synthetic.labels, [])
    run = train(data, "bilstm", tmp_path / "run", preset="madsen2022-sst", epochs=1, hidden_dim=8, embed_dim=8, quiet_eval=True)
    vocab = run.collate.vocab
    assert vocab.specials == ["<pad>", "<unk>", "<s>", "</s>", "[MASK]"] and "good" not in vocab.itos
    assert len(run.data().train) == len(synthetic.train) and len(run.data().dev) == len(synthetic.dev)
    extra = run.info["model"]["extra"]
    assert extra["wrap"] == vocab.encode(["<s>", "</s>"]) and extra["zero_rows"] == [0, 1, 2, 3, 4]
    assert run.info["train"]["mask_special"] is True and run.info["train"]["zero_specials"] is True
    assert mask_token(run) == "[MASK]"
    table = run.model.embedding.weight
    assert torch.count_nonzero(table[[1, 4]]) == 0  # <unk> and [MASK] never occur in training: they stay at zero
    assert torch.count_nonzero(table[[2, 3]]) > 0  # <s> and </s> are read, so they are trained from zero

    result = run_test("roar", run, out=tmp_path / "roar", methods=["attention"], ratios=[50], epochs=1, plot=False)
    assert result.summary["recursive"] is False and "racu_attention" in result.summary
    retrained = load_run(tmp_path / "roar" / "subruns" / "roar" / "seed-0" / "attention" / "ratio-50")
    masks = json.loads((tmp_path / "roar" / "subruns" / "roar" / "seed-0" / "attention" / "ratio-50.masks.json").read_text())
    assert all(len(m) == len(ex.tokens) // 2 for m, ex in zip(masks["train"], run.data().train))
    assert torch.count_nonzero(retrained.model.embedding.weight[4]) > 0  # the masked words reached it as [MASK]
    assert torch.count_nonzero(retrained.model.embedding.weight[1]) == 0  # not as <unk>


def test_zero_rows_take_no_random_draw() -> None:
    config = ModelConfig(model="bilstm", task_type="classification", vocab_size=12, num_labels=2, embed_dim=4, hidden_dim=4)
    torch.manual_seed(3)
    plain = build_model(config)
    torch.manual_seed(3)
    zeroed = build_model(ModelConfig(**{**config.to_dict(), "extra": {"zero_rows": [1, 5]}}))
    for (name, a), (_, b) in zip(plain.named_parameters(), zeroed.named_parameters()):
        if name == "embedding.weight":
            assert torch.equal(b[[1, 5]], torch.zeros(2, 4)) and torch.equal(a[[0, 2, 3, 4, *range(6, 12)]], b[[0, 2, 3, 4, *range(6, 12)]])
        else:
            assert torch.equal(a, b), name


def test_madsen_babi_preset_builds_their_32_unit_pair_model(tmp_path) -> None:
    """On a QA task the bAbI preset trains experiments/babi.py's model: 32 units per direction, attention and decoder
    (hidden_size=32), 50-d embeddings, their pair head (the question's own table and final states; see
    tests/models/test_rnn.py), weight decay on every parameter."""
    from attnaudit.data.readers import read_babi

    story = tmp_path / "qa.txt"
    story.write_text("".join(f"1 Mary went to the {p}.\n2 John went to the {q}.\n3 Where is Mary? \t{p}\t1\n"
                             for p, q in [("kitchen", "garden"), ("garden", "office"), ("office", "kitchen")] * 8))
    examples = read_babi(story)
    data = TaskData("qa", "pair", examples[:16], examples[16:20], examples[20:], labels=["garden", "kitchen", "office"])
    run = train(data, "bilstm", tmp_path / "run", preset="madsen2022-babi", epochs=1, quiet_eval=True)
    model = run.info["model"]
    assert (model["hidden_dim"], model["embed_dim"], model["extra"]["pair_head"]) == (32, 50, "madsen2022")
    assert run.model.encoder.output_dim == 64 and run.model.combine_query.out_features == 32
    assert run.model.query_embedding.weight.shape == run.model.embedding.weight.shape
    loop = TrainConfig(**run.info["train"]).loop("pair")
    assert [g["weight_decay"] for g in loop.optimiser.groups(run.model)] == [1e-5]  # one group: everything decays
