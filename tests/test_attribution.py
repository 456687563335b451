"""The sparse-attention tests follow Drozdyuk et al., "Is Sparse Attention a Better Explanation?";
Meister et al. 2021 ("Is Sparse Attention more Interpretable?") is another paper and was cited
by mistake. Nothing the project writes may carry the wrong attribution again."""

from __future__ import annotations

from pathlib import Path

from attnaudit.experiments import discover

REPO = Path(__file__).resolve().parents[1]
SPARSE_TESTS = ("activation-swap", "shuffle", "key-adversary", "random-keys", "opposite-keys")


def test_sparse_tests_name_their_paper() -> None:
    registry = discover()
    for name in SPARSE_TESTS:
        assert registry[name].paper.startswith("Drozdyuk et al., Is Sparse Attention a Better Explanation?"), name


def test_no_file_attributes_them_to_meister() -> None:
    wrong = "Meister et al"
    places = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "src").rglob("*.py"),
              *(REPO / "benchmarks").rglob("*.py"), *(REPO / "benchmarks" / "results").glob("*.json")]
    assert [str(p) for p in places if wrong in p.read_text(encoding="utf-8")] == []
