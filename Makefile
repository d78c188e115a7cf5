# The two commands of the README: `make demo` and `make test`. Each sets up what it needs first.
.PHONY: setup demo test test-slow lint fixtures lab

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/driftscope run parameters/demo_shapes.yaml --no-gate

test: setup
	.venv/bin/lint-imports --no-cache
	.venv/bin/python -m pytest -n 2 --dist loadfile

lab: setup
	bash scripts/lab.sh

test-slow: setup
	.venv/bin/python -m pytest -m slow

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check lib tests fixtures benchmarks examples scripts notebooks
	.venv/bin/lint-imports --no-cache
	.venv/bin/python scripts/architecture.py --check

fixtures: setup
