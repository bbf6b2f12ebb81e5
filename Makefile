# Figures and tables are built only from files under results/ (never training): see README.
PYTHON ?= python
RESULTS ?= results
PROBE_ARGS ?=
# I(h,x), I(h,y) estimator settings of every committed row (README, Analysis): 2,000 train and 1,000 test images.
MI_ARGS ?= --train-subset 2000 --test-subset 1000 --epochs 10
BENCH_ARGS ?=
MODULE_PARALLEL_ARGS ?=
DATA_ROOT ?=
DATA = $(if $(DATA_ROOT),--data-root $(DATA_ROOT))

.PHONY: help setup test check test-slow status readme fig7 fig8 fig10 fig_info_plane fig_curves fig_memory fig_schedule figures table2 table3 table_schedule table_paired table_e2e_gap table_ranking table_remainder_budget table_remainder_budget_means claims tables probes mutual-info test-predictions schedule-analysis bench bench-module-parallel bench-epochs reproduce fixture cpu-weights

.DEFAULT_GOAL := help
# `make` alone lists the targets: the text after `## ` on each rule's line.
help:  ## this list
	@awk -F':.*## ' '/^[a-z][a-z0-9_-]*:.*## / {printf "  %-22s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@printf "  %-22s %s\n" "<figure or table>" "one of: $(FIGURES) $(TABLES) (RECIPE=, ARCH=: see the Makefile)"

setup:  ## install the CPU torch and this package with its dev tools
	$(PYTHON) -m pip install torch==2.13.0 -e ".[dev]"

test:  ## run the code's tests (CPU only, minutes)
	$(PYTHON) -m pytest

check:  ## check the committed results and docs: tables rebuild, columns documented, links, notebooks
	$(PYTHON) -m pytest -m check

test-slow:  ## the slow equivalence tests (multi-process training, fresh-process benchmarks)
	$(PYTHON) -m pytest -m slow

# RECIPE (fig7, fig8, fig10, fig_info_plane, fig_curves, table2, claims): instead of the paper's recipe (the default),
# show the recipe whose label contains it, or RECIPE=fixture (the 12-epoch CPU toy), as <target>-fixture.
RECIPE ?=
# ARCH (the same figures and table2): draw that network's runs, e.g. ARCH=resnet110, as <target>-resnet110.
ARCH ?=
FIGURES = fig7 fig8 fig10 fig_info_plane fig_curves fig_memory fig_schedule
TABLES = table2 table3 table_schedule table_paired table_e2e_gap table_ranking table_remainder_budget table_remainder_budget_means claims
# ESTIMATOR (fig10, fig_info_plane): remainder (the paper's units; the default once it covers E2E and greedy SL
# at layer 1, their module ends and the last, every layer of E2E) or 1c2f, as <target>-<ESTIMATOR>.
ESTIMATOR ?=
BUILD = @$(PYTHON) -m analysis.build --results $(RESULTS) $(if $(RECIPE),--recipe "$(RECIPE)") $(if $(ARCH),--arch $(ARCH)) \
        $(if $(ESTIMATOR),--estimator $(ESTIMATOR))
# Importing torch, pandas and matplotlib costs seconds per process, so figures and tables named together
# (`make fig7 fig8 table2`) are built in one process, by one of them; one a rule depends on is built alone.
GOALS = $(sort $(filter $(FIGURES) $(TABLES),$(MAKECMDGOALS)))
$(FIGURES) $(TABLES):
	$(if $(filter $@,$(GOALS)),$(if $(filter $@,$(firstword $(GOALS))),$(BUILD) $(GOALS),@:),$(BUILD) $@)

# The claims judged on the CPU fixture (tables/claims-fixture.md) and the fixture's figures and table they cite,
# committed so that each `from` of that table opens.
FIXTURE_FIGURES = fig8 fig10
FIXTURE_TABLES = table2 claims
FIXTURE_BUILD = @$(PYTHON) -m analysis.build --results $(RESULTS) --recipe fixture

# One process each.
figures:  ## every figure from results/ (fig10, fig_info_plane: each estimator), the CPU fixture's fig8, fig10
	$(BUILD) $(FIGURES) --alternatives
	$(FIXTURE_BUILD) $(FIXTURE_FIGURES)

tables:  ## every table, from results/, and the CPU fixture's Table 2 and claims (tables/*-fixture.md)
	$(BUILD) $(TABLES)
	$(FIXTURE_BUILD) $(FIXTURE_TABLES)

readme: claims table2  ## the README's claims and Table 2, pasted from results/tables/
	$(PYTHON) -m analysis.readme --results $(RESULTS)

# Analyses of every finished run in results/runs (skips runs already in the CSV).
probes:  ## linear probes of every finished run not yet probed
	$(PYTHON) -m analysis.probe --runs $(RESULTS)/runs --out $(RESULTS)/analysis/linear_probe.csv $(DATA) $(PROBE_ARGS)

mutual-info:  ## I(h,x), I(h,y) by the 1c2f estimator, of every finished run not yet estimated
	$(PYTHON) -m analysis.mutual_info --runs $(RESULTS)/runs --out $(RESULTS)/analysis/mutual_information.csv $(DATA) $(MI_ARGS)

# Every network with weights (the CPU-trained ones after `make cpu-weights`) scored image by image
# on its whole test split, for table_paired, table_e2e_gap and table_ranking: the test images a run never used give a
# fresh test of InfoPro against greedy SL, of each method against E2E and of each step of the paper's ranking. A run on
# the whole split without weights enters with its training's record.
test-predictions:  ## every network with weights scored image by image
	$(PYTHON) -m analysis.score_test_images --runs $(RESULTS) --out $(RESULTS)/analysis/test_predictions.csv $(DATA)

# The schedule check's analysis (fig_schedule): probes and I(h,x), I(h,y) of its seed-1 runs of E2E and K = 4 and
# seed-0 runs of K = 2, 8 and 16 (36 epochs) and of their fixture twins (12 epochs), with the fixture's estimator
# settings (MI_ARGS); the weights of both come back with `make cpu-weights`.
SCHEDULE_RUNS ?= K1-n10000-e12-b128-s1 K4-n10000-e12-b128-s1 K1-n10000-e36-b128-s1 K4-n10000-e36-b128-s1 \
                 K8-n10000-e12-b128-s0 K8-n10000-e36-b128-s0 K16-n10000-e12-b128-s0 K16-n10000-e36-b128-s0 \
                 K2-n10000-e12-b128-s0 K2-n10000-e36-b128-s0
schedule-analysis:  ## probes and I(h,x), I(h,y) of the schedule check's runs
	$(PYTHON) -m analysis.probe --runs $(RESULTS) --only $(SCHEDULE_RUNS) --out $(RESULTS)/analysis/schedule-check/linear_probe.csv $(DATA) $(PROBE_ARGS)
	$(PYTHON) -m analysis.mutual_info --runs $(RESULTS) --only $(SCHEDULE_RUNS) --out $(RESULTS)/analysis/schedule-check/mutual_information.csv $(DATA) $(MI_ARGS)

# Memory and speed of every method, each in a fresh process (default: ResNet-110, batch 1024).
bench:  ## memory and speed of every method (BENCH_ARGS)
	$(PYTHON) -m experiments.bench --out $(RESULTS)/bench $(BENCH_ARGS)

# Images/s of module-parallel training (one rank per module) vs the synchronous trainer, K = 2 and 4.
bench-module-parallel:  ## module-parallel against synchronous training, images/s
	$(PYTHON) -m experiments.bench_module_parallel --out $(RESULTS)/bench $(MODULE_PARALLEL_ARGS)

# Seconds per ResNet-32 epoch, eager and compiled steps, in fresh processes (DATA_ROOT: the cifar10-jpeg copy).
bench-epochs:  ## seconds per training epoch in each step mode
	$(PYTHON) -m experiments.bench_epochs --dataset cifar10-jpeg --out $(RESULTS)/bench $(DATA)

# Every GPU result, stage by stage within MINUTES; run it again to continue (DATA_ROOT: the cifar10-jpeg copy).
MINUTES ?= 25
reproduce:  ## every GPU result, stage by stage within MINUTES
	$(PYTHON) -m experiments.reproduce --time-budget $(MINUTES) --results $(RESULTS) $(DATA)

# The small real fixture committed in results/ (CPU; needs the cifar10-jpeg copy in .data/ or DATA_ROOT).
fixture:  ## the CPU fixture's runs (needs the cifar10-jpeg copy)
	$(PYTHON) -m experiments.grid cpu-fixture --device cpu --out $(RESULTS)/runs $(DATA)

# The CPU-trained networks' weights (the fixture's, every seed, and the schedule check's) are in git's history only,
# so a clone's tree stays lean: this restores each glob's files from the commit before they left, beside their
# records (git ignores them), for a re-run of their analyses (`make probes mutual-info test-predictions
# schedule-analysis` skip networks without weights). Retraining (`make fixture`; `python -m experiments.grid
# cpu-schedule-check`) gives other weights on another processor (docs/training.md, replays).
FIXTURE_WEIGHTS = results/runs/*-n10000-e12-b128-*/model.pt
SCHEDULE_CHECK_WEIGHTS = results/schedule-check/*/model.pt
restore_from_history = git restore --worktree --source="$$(git rev-list -1 HEAD -- '$(1)')^" -- '$(1)'
cpu-weights:  ## the CPU-trained networks' weights, back from git's history
	$(call restore_from_history,$(FIXTURE_WEIGHTS))
	$(call restore_from_history,$(SCHEDULE_CHECK_WEIGHTS))

# Where each run of each GRID stands in results/runs: done (test error), partial or missing (minutes left), and in
# all, with the GPU time left and the leases of LEASE_MINUTES device-minutes it needs at least (empty: not counted).
# DATASET: the committed runs are the JPEG copy's (cifar10-jpeg); a user's own runs of CIFAR-10 are cifar10's.
GRID ?= table2-resnet32 table2-dgl-resnet32
DATASET ?= cifar10-jpeg
LEASE_MINUTES ?= 15
status:  ## where each run of Table 2's grids (GRID) stands, and the training and GPU time left
	@$(foreach grid,$(GRID),echo "== $(grid)" && $(PYTHON) -m experiments.grid $(grid) --dataset $(DATASET) --status \
	    --out $(RESULTS)/runs --bench-out $(RESULTS)/bench $(if $(LEASE_MINUTES),--lease-minutes $(LEASE_MINUTES)) &&) true
