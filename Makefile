# The two commands of the README: `make demo` and `make test`. Each sets up what it needs first.
.PHONY: setup demo demo-trend test test-slow lint fixtures lab docs

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/driftscope run parameters/demo_shapes.yaml --no-gate

# notebook 05 from a fresh clone: the demo at the previous commit (a temporary worktree) and at this one, then the
# trend between them (a failing verdict, exit 1, is the demo's finding, not an error of the recipe)
demo-trend: setup
	.venv/bin/driftscope batch parameters/demo_shapes.yaml --commit HEAD~1 || [ $$? -eq 1 ]
	.venv/bin/driftscope batch parameters/demo_shapes.yaml || [ $$? -eq 1 ]
	.venv/bin/driftscope trend parameters/demo_shapes.yaml

test: setup
	.venv/bin/lint-imports --no-cache
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir site
	.venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

lab: setup
	bash scripts/lab.sh

# the documentation site (docs/, mkdocs.yml) into site/; `.venv/bin/mkdocs serve` to browse it while editing
docs: setup
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir site

test-slow: setup
	.venv/bin/python -m pytest -m slow

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check lib tests fixtures benchmarks examples scripts notebooks
	.venv/bin/lint-imports --no-cache
	.venv/bin/python scripts/architecture.py --check
	.venv/bin/python scripts/parameters_doc.py --check
	.venv/bin/python scripts/environment.py --check

fixtures: setup
