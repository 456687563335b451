"""Key tests: replace a Transformer's keys by learned ones and see what attention is worth.

Sparse-attention study, Table 1 rows "adversarial", "random keys" and "opposite". A small
MLP (one hidden ReLU layer, 256 units) maps, for every token, the keys of all layers
(concatenated, heads merged) to new keys for all layers; they replace the model's keys
through keys interventions while the model itself stays frozen.

* ``key-adversary``: input the real keys; loss ``α·CE(y, ŷ) − (1 − α)·dist(k, k_adv)``:
  keep the prediction while moving the keys (and so the attention) as far as possible.
* ``random-keys``: input uniform noise (the MLP cannot see the real keys), CE only: how
  accurate is the model when attention carries no content information?
* ``opposite-keys``: input the real keys, CE towards the other label (multi-class: the
  fixed derangement ``y -> (y+1) mod C``): can attention alone flip the decision?

The distance term is bounded so that training is stable: per token and layer,
``tanh(‖k − k_adv‖₂ / ‖k‖₂)`` in [0, 1), averaged over real tokens and layers. Unbounded,
the adversary could lower the loss without limit by inflating the keys, and the CE term
would be drowned out; relative to ``‖k‖`` it is scale-free across layers and models.

The new keys of layer ``l`` are a function of the clean model's keys (from an unmodified
forward pass), applied as tensors; the layers after the first therefore see keys that do
not follow the changed states, exactly as "an MLP over the keys of every layer" implies.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnaudit.data.types import Batch, Example
from attnaudit.errors import AttnAuditError
from attnaudit.experiments.common.applies import transformer_classifier_reason
from attnaudit.experiments.common.measures import layer_jsd
from attnaudit.experiments.common.plots import plot_attention_rows
from attnaudit.experiments.common.rows import ATTENTION_TABLE, attention_rows, batch_labels
from attnaudit.experiments.common.seeding import seeded_generator
from attnaudit.experiments.experiment import AuditSettings, Experiment, Result, register, summarise
from attnaudit.models.interface import AttentionModel, AttentionTrace, Intervention
from attnaudit.models.transformer import merge_heads, split_heads
from attnaudit.plotting import save_figure
from attnaudit.progress import track
from attnaudit.run import Run
from attnaudit.training.loop import Hooks, LoopConfig, Optimiser, fit

# Keys for seeded_generator: which stream of uniform noise the random-keys test draws.
_TRAIN_NOISE, _EVAL_NOISE = 1, 2


class KeyAdversary(nn.Module):
    """Per token, the keys of all ``layers`` (``layers·d_model``) -> ``hidden`` ReLU -> new keys."""

    def __init__(self, layers: int, d_model: int, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(layers * d_model, hidden), nn.ReLU(), nn.Linear(hidden, layers * d_model)
        )

    def forward(self, keys: Tensor) -> Tensor:
        """``(B, L, T, d)`` -> ``(B, L, T, d)``."""
        b, n_layers, t, d = keys.shape
        flat = keys.permute(0, 2, 1, 3).reshape(b, t, n_layers * d)
        return self.net(flat).view(b, t, n_layers, d).permute(0, 2, 1, 3)


def stacked_keys(trace: AttentionTrace) -> Tensor:
    """The keys of every layer with heads merged, ``(B, L, T, d_model)``."""
    missing = [i for i, layer in enumerate(trace.layers) if layer.keys is None]
    if missing:
        raise AttnAuditError(f"attention layer(s) {missing} record no keys; the key tests need them")
    keys = [layer.keys for layer in trace.layers if layer.keys is not None]  # every layer's, after the check
    return torch.stack([merge_heads(k) for k in keys], dim=1)


def key_interventions(keys: Tensor, heads: int) -> list[Intervention]:
    """Replace layer ``l``'s keys by ``keys[:, l]`` (``(B,T,d)``, split into ``heads``)."""
    return [Intervention(layer=layer, keys=split_heads(keys[:, layer], heads)) for layer in range(keys.shape[1])]


def bounded_distance(keys: Tensor, new_keys: Tensor, mask: Tensor) -> Tensor:
    """Per instance, mean over layers and real tokens of ``tanh(‖k − k'‖ / ‖k‖)`` (see module docstring)."""
    ratio = (keys - new_keys).norm(dim=-1) / keys.norm(dim=-1).clamp_min(1e-6)
    m = mask[:, None, :].to(ratio.dtype).expand_as(ratio)
    return (torch.tanh(ratio) * m).sum((1, 2)) / m.sum((1, 2)).clamp_min(1.0)


def relative_distance(keys: Tensor, new_keys: Tensor, mask: Tensor) -> Tensor:
    """Per instance, mean over layers and real tokens of ``‖k − k'‖ / ‖k‖`` (reported, not trained on)."""
    ratio = (keys - new_keys).norm(dim=-1) / keys.norm(dim=-1).clamp_min(1e-6)
    m = mask[:, None, :].to(ratio.dtype).expand_as(ratio)
    return (ratio * m).sum((1, 2)) / m.sum((1, 2)).clamp_min(1.0)


@contextmanager
def frozen(model: AttentionModel) -> Iterator[None]:
    """Eval mode with no parameter gradients; restores both afterwards."""
    flags = [p.requires_grad for p in model.parameters()]
    was_training = model.training
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
        model.train(was_training)


@dataclass
class KeyOptions(Experiment.Options):
    """Options every key test shares."""

    epochs: int = field(default=3, metadata={"help": "Epochs over the training subset."})
    lr: float = field(default=1e-3, metadata={"help": "Adam learning rate of the key MLP."})
    batch_size: int = field(default=32, metadata={"help": "Instances per step (training and evaluation)."})
    train_limit: int | None = field(default=None, metadata={"help": "Train on the first N train examples (default all)."})
    hidden: int = field(default=256, metadata={"help": "Hidden units of the key MLP."})
    show: int = field(default=3, metadata={"help": "Sentences shown in the attention heatmap."})


@dataclass
class AdversaryOptions(KeyOptions):
    alpha: float = field(default=0.5, metadata={"help": "Loss weight: alpha*CE - (1-alpha)*bounded key distance."})


@dataclass
class OppositeOptions(KeyOptions):
    alpha: float = field(
        default=1.0, metadata={"help": "Loss weight: alpha*CE(opposite label) - (1-alpha)*bounded key distance."}
    )


class KeyTest(Experiment):
    """Shared training and evaluation; subclasses set ``source`` and ``opposite``."""

    settings = AuditSettings(
        options={"epochs": 2, "train_limit": 2000},
        transformers_only=True,
        demo={"full": {"epochs": 1, "train_limit": 500}, "quick": {"epochs": 1, "train_limit": 16, "hidden": 8}},
    )

    source: ClassVar[str] = "keys"  # "keys": the MLP sees the real keys; "noise": uniform noise
    opposite: ClassVar[bool] = False
    setting_label: ClassVar[str] = "attacked keys"
    examples = ("runs/sst2-transformer --limit 200 --data-dir ../shared/data",)
    Options = KeyOptions

    def applies(self, run: Run) -> str | None:
        return transformer_classifier_reason(run)

    def plot(self, result: Result, directory: Path) -> list[Path]:
        return _plot(self.name, result, directory)

    def _alpha(self, options: Any) -> float:
        alpha = float(getattr(options, "alpha", 1.0))
        if not 0.0 <= alpha <= 1.0:
            raise AttnAuditError(f"--alpha must lie in [0, 1], got {alpha}")
        return alpha

    def _targets(self, gold: Tensor, num_labels: int) -> Tensor:
        return (gold + 1) % num_labels if self.opposite else gold

    def _inputs(self, keys: Tensor, generator: torch.Generator | None) -> Tensor:
        """The MLP's input: the real keys, or uniform noise on [-1, 1] when a noise ``generator`` is given."""
        if generator is None:
            return keys
        return (2.0 * torch.rand(keys.shape, generator=generator) - 1.0).to(keys.device, keys.dtype)

    def _attack(
        self, run: Run, adversary: KeyAdversary, batch: Batch, generator: torch.Generator | None
    ) -> tuple[Any, Any, Tensor, Tensor]:
        """Clean output, attacked output, clean keys and adversarial keys for one batch."""
        model = run.model
        with torch.no_grad():
            cache = model.encode(batch)
            clean = model.decode(cache)
        keys = stacked_keys(clean.trace)
        new_keys = adversary(self._inputs(keys, generator))
        first_keys = clean.trace.layers[0].keys
        assert first_keys is not None  # a Transformer records its keys
        attacked = model.decode(cache, key_interventions(new_keys, first_keys.shape[1]))
        return clean, attacked, keys, new_keys

    def train_adversary(self, run: Run, options: Any, seed: int) -> tuple[KeyAdversary, list[dict[str, float]]]:
        """Fit the key MLP on the train split (or its first ``train_limit`` examples) with the one
        training loop; seeded (its initial weights without touching the global generator)."""
        alpha = self._alpha(options)
        if options.epochs < 1 or options.batch_size < 1:
            raise AttnAuditError("--epochs and --batch-size must be at least 1")
        train = run.data().train
        if options.train_limit is not None:
            if options.train_limit < 1:
                raise AttnAuditError(f"--train-limit must be at least 1, got {options.train_limit}")
            train = train[: options.train_limit]
        if not train:
            raise AttnAuditError("the key tests train on the train split, which is empty")
        cfg = run.config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            adversary = KeyAdversary(run.model.num_attention_layers, cfg.d_model, options.hidden).to(run.device)
        noise: list[torch.Generator | None] = [None]

        def epoch_start(epoch: int) -> None:
            noise[0] = seeded_generator(seed, _TRAIN_NOISE, epoch) if self.source == "noise" else None

        def loss(net: nn.Module, batch: Batch) -> tuple[Tensor, dict[str, Tensor]]:
            target = self._targets(batch_labels(batch), len(run.labels))
            _, attacked, keys, new_keys = self._attack(run, adversary, batch, noise[0])
            ce = F.cross_entropy(attacked.logits, target)
            distance = bounded_distance(keys, new_keys, batch.mask.bool()).mean()
            total = alpha * ce - (1.0 - alpha) * distance if self.source == "keys" else ce
            hit = (attacked.logits.argmax(-1) == target).float().mean()
            return total, {"ce": ce, "bounded_distance": distance, "train_accuracy": hit}

        # Adam, constant learning rate, no clipping, every epoch, the last one kept
        loop = LoopConfig(options.epochs, options.batch_size, seed, Optimiser("adam", options.lr))
        hooks = Hooks(loss=loss, epoch_start=epoch_start, label=f"{self.name} ", train_key="loss")
        history = fit(adversary, run, train, loop, hooks)["history"]
        return adversary, history

    def run(self, run: Run, examples: list[Example], options: Any, seed: int = 0) -> Result:
        model = run.model
        n_layers = model.num_attention_layers
        with frozen(model):
            adversary, history = self.train_adversary(run, options, seed)
            adversary.eval()
            generator = seeded_generator(seed, _EVAL_NOISE) if self.source == "noise" else None
            original, attacked_hits, divergence, distances = [], [], [], []
            targets, heatmaps = [], []
            offset = 0
            total = -(-len(examples) // options.batch_size)
            with torch.no_grad():
                for batch in track(run.batches(examples, options.batch_size), f"{self.name} evaluate", total=total):
                    target = self._targets(batch_labels(batch), len(run.labels))
                    clean, attacked, keys, new_keys = self._attack(run, adversary, batch, generator)
                    original.append(clean.logits.argmax(-1) == target)
                    attacked_hits.append(attacked.logits.argmax(-1) == target)
                    divergence.append(torch.stack(layer_jsd(clean.trace, attacked.trace), dim=1))
                    distances.append(relative_distance(keys, new_keys, batch.mask.bool()))
                    targets.append(target)
                    shown = range(offset, offset + len(batch))
                    heatmaps += attention_rows(run, batch, clean.trace, "original", options.show, shown)
                    heatmaps += attention_rows(run, batch, attacked.trace, self.setting_label, options.show, shown)
                    offset += len(batch)
        base = torch.cat(original).float()
        hit = torch.cat(attacked_hits).float()
        jsds = torch.cat(divergence)  # (N, L)
        dist = torch.cat(distances)
        target_ids = torch.cat(targets).tolist()
        summary: dict[str, Any] = {
            "trained_normaliser": run.config.attention,
            "accuracy_original": float(base.mean()),
            "accuracy_attacked": float(hit.mean()),
            "jsd_mean": float(jsds.mean()),
            **{f"jsd_layer{layer}_mean": float(jsds[:, layer].mean()) for layer in range(n_layers)},
            "key_distance_mean": summarise(dist.tolist())["mean"],
        }
        instances = []
        for i, example in enumerate(examples):
            item: dict[str, Any] = {
                "index": i,
                "label": example.label,
                "target": run.labels[target_ids[i]],
                "original_correct": int(base[i]),
                "attacked_correct": int(hit[i]),
                "key_distance": float(dist[i]),
            }
            item.update({f"jsd_layer{layer}": float(jsds[i, layer]) for layer in range(n_layers)})
            instances.append(item)
        per_layer = [
            {"layer": layer, **{f"jsd_{k}": v for k, v in summarise(jsds[:, layer].tolist()).items()}}
            for layer in range(n_layers)
        ]
        return Result(
            test=self.name,
            summary=summary,
            instances=instances,
            tables={"training": history, "per_layer": per_layer, ATTENTION_TABLE: heatmaps},
            meta={"notes": self.notes(options), "published": {}},
        )

    def verdict(self, result: Result) -> list[dict[str, Any]]:
        """What learned keys do to accuracy and attention, read per key test (sparse-attention study, Table 1)."""
        s = result.summary
        before, after, moved = s.get("accuracy_original"), s.get("accuracy_attacked"), s.get("jsd_mean")
        if not (isinstance(before, (int, float)) and isinstance(after, (int, float)) and isinstance(moved, (int, float))):
            return super().verdict(result)
        change = f"accuracy {before:.3f} → {after:.3f}, attention moved by JSD {moved:.3f} nats"
        if self.opposite:
            meaning = (
                f"{change}: keys alone push the decisions to the opposite label, so attention steers the prediction"
                if after < before - 0.1
                else f"{change}: changing only the keys does not flip the decisions"
            )
        elif self.source == "noise":
            meaning = (
                f"{change}: with keys that carry no content the model stays accurate, so attention's content matters little"
                if after >= before - 0.05
                else f"{change}: without content in the keys the model loses accuracy, so it uses what attention selects"
            )
        else:
            meaning = (
                f"{change}: very different attention keeps the predictions, so attention is not a unique explanation"
                if after >= before - 0.05
                else f"{change}: moving the keys costs accuracy; the adversary could not keep the predictions"
            )
        return [{"statistic": "accuracy_attacked", "value": after, "published": "", "interpretation": meaning}]

    def notes(self, options: Any) -> list[str]:
        """Caveats recorded with the result."""
        return [
            f"key MLP: hidden {options.hidden}, ReLU, Adam lr {options.lr}, {options.epochs} epochs, batch "
            f"{options.batch_size}, train examples: {'all' if options.train_limit is None else options.train_limit}",
            "keys of layer l are replaced by the MLP's output computed from the clean model's keys; "
            "the Transformer's weights are frozen",
            "jsd_layer<l>: JSD (nats) between clean and attacked attention of layer l, mean over heads and "
            "real queries; key_distance: mean over tokens and layers of ||k - k'|| / ||k||",
            "the study reports these rows without a numeric figure quoted in the brief, so meta.published is empty",
        ]


@register
class AdversarialKeys(KeyTest):
    """One of the key tests of this module (its docstring gives the method)."""

    name = "key-adversary"
    settings = replace(KeyTest.settings, rank=13)
    description = "An MLP over all layers' keys trained to keep the prediction while moving the keys (alpha trade-off)"
    paper = "Drozdyuk et al., Is Sparse Attention a Better Explanation? (Table 1: adversarial)"
    source = "keys"
    setting_label = "adversarial keys"
    Options = AdversaryOptions

    def notes(self, options: Any) -> list[str]:
        return super().notes(options) + [
            f"loss = {options.alpha}*CE(gold, prediction) - {1 - options.alpha:g}*mean tanh(||k - k_adv|| / ||k||): "
            "the distance is bounded in [0, 1) so the adversary cannot win by inflating keys; "
            "accuracy is against the gold labels"
        ]


@register
class RandomKeys(KeyTest):
    """One of the key tests of this module (its docstring gives the method)."""

    name = "random-keys"
    settings = replace(KeyTest.settings, rank=11)
    description = "The key MLP fed uniform noise instead of the keys, trained on cross-entropy alone"
    paper = "Drozdyuk et al., Is Sparse Attention a Better Explanation? (Table 1: random keys)"
    source = "noise"
    setting_label = "random keys"

    def notes(self, options: Any) -> list[str]:
        return super().notes(options) + [
            "the MLP input is uniform noise on [-1, 1] (fresh per batch, seeded), so the keys carry no content; "
            "loss = CE(gold) only; key_distance compares its output with the real keys"
        ]


@register
class OppositeKeys(KeyTest):
    """One of the key tests of this module (its docstring gives the method)."""

    name = "opposite-keys"
    settings = replace(KeyTest.settings, rank=12)
    description = "The key MLP trained so that the model predicts the other label; accuracy vs the swapped labels"
    paper = "Drozdyuk et al., Is Sparse Attention a Better Explanation? (Table 1: opposite)"
    source = "keys"
    opposite = True
    setting_label = "opposite keys"
    Options = OppositeOptions

    def notes(self, options: Any) -> list[str]:
        return super().notes(options) + [
            "targets are the swapped labels (binary: the other label; multi-class: label id (y+1) mod C); "
            "accuracy_original / accuracy_attacked are both measured against the swapped labels",
            f"loss = {options.alpha}*CE(swapped) - {1 - options.alpha:g}*bounded key distance",
        ]


def _plot(name: str, result: Result, directory: Path) -> list[Path]:
    """Accuracy before/after and per-instance JSD per layer, plus the attention heatmaps."""
    from attnaudit.plotting import pyplot

    plt = pyplot()

    paths: list[Path] = []
    if result.instances:
        layers = sorted(int(k[len("jsd_layer"):]) for k in result.instances[0] if k.startswith("jsd_layer"))
        fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2), layout="constrained")
        left.bar(["original", "attacked"], [result.summary["accuracy_original"], result.summary["accuracy_attacked"]])
        left.set_ylim(0, 1)
        left.set_ylabel("accuracy (vs target labels)")
        data = [[row[f"jsd_layer{layer}"] for row in result.instances] for layer in layers]
        right.boxplot(data)
        right.set_xticks(range(1, len(layers) + 1), [f"layer {layer}" for layer in layers])
        right.set_ylabel("JSD clean vs attacked attention (nats)")
        fig.suptitle(f"{name} ({result.summary['trained_normaliser']})", fontsize=10)
        paths += save_figure(fig, directory, name)
    paths += plot_attention_rows(
        result.tables.get(ATTENTION_TABLE, []), directory, f"{name}-attention", f"{name}: original vs attacked"
    )
    return paths
