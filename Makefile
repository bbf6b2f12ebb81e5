# Figures and tables are built only from files under results/ (never training): see README.
PYTHON ?= python
RESULTS ?= results
PROBE_ARGS ?=
MI_ARGS ?=

.PHONY: setup test fig7 fig8 fig10 figures table2 tables probes mutual-info fixture

setup:
	$(PYTHON) -m pip install torch==2.13.0 -e ".[dev]"

test:
	$(PYTHON) -m pytest

fig7 fig8 fig10 table2:
	@$(PYTHON) -m analysis.build $@ --results $(RESULTS)

figures: fig7 fig8 fig10

tables: table2

# Analyses of every finished run in results/runs (skips runs already in the CSV).
probes:
	$(PYTHON) -m analysis.probe --runs $(RESULTS)/runs --out $(RESULTS)/analysis/linear_probe.csv $(PROBE_ARGS)

mutual-info:
	$(PYTHON) -m analysis.mutual_info --runs $(RESULTS)/runs --out $(RESULTS)/analysis/mutual_information.csv $(MI_ARGS)

# The small real fixture committed in results/ (CPU; needs the cifar10-jpeg copy, see README).
fixture:
	$(PYTHON) -m experiments.grid cpu-fixture --device cpu --out $(RESULTS)/runs
