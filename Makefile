# biasviz — `make figures` rebuilds every figure from nothing; `make test` runs the test suite.
# Both install what they need into .venv first (Python 3.11+ and pip are all that must exist).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BIASVIZ := $(BIN)/biasviz
STAMP  := $(VENV)/.installed

# The figure sets: one config per scheme in configs/ (Figures 10, 12, 13, 14 of the CABLE paper, and CABLE).
SCHEMES := alibi kerple-log fire t5 cable
# The learned scheme whose training is followed checkpoint by checkpoint (its config sets save_every).
DYNAMICS := kerple-log
# Length extrapolation: these tiny models (trained on 128 tokens) summarised at 16384 (extract --summary).
LONG     := alibi kerple-log
LONG_LEN := 16384
TRAIN_LEN := 128
# Position in every model (docs/positional.md): the positional logits of the five, RoPE and NoPE (configs/rope.toml,
# nope.toml train them), at the training length and at 16 times it
POSITIONAL := $(SCHEMES) rope nope
POS_LEN  := 2048
POS_SAMPLES := 8
# Position as papers measure it (docs/position-measures.md), on one page from the same POS_LEN summaries: rotary frequency
# use, band mass and the context U-curve, each with its 95 % band over the POS_SAMPLES windows
MEASURES := rope alibi
RUNS    := runs
DATA    := data
FIGURES := figures
STAGES  := $(RUNS)/stages
# The tiny models' own words on the positional figure (paper-figures says its own)
POS_NOTE := tiny models, 300 steps on $(TRAIN_LEN)-token windows of Python's standard library
# Options after each config's own for `biasviz train` (paper-figures: the GPT-2-small preset, its steps and
# length); with SAVE_EVERY, the DYNAMICS scheme saves a checkpoint that often and the others none.
TRAIN_ARGS :=
SAVE_EVERY :=

# `make paper-figures`: GPT-2-small variants (docs/models.md; the size of the paper's Figures 10-14) trained on
# PAPER_LEN-token windows, on the GPU when there is one (biasviz train --device auto), and the same figures drawn
# from them. Everything goes under paper/ (runs, data, figures), apart from what `make figures` and `make clean`
# touch: hours of training are never swept away with the tiny models. Any of these can be set on the command line.
PAPER         := paper
PAPER_STEPS   := 10000
PAPER_LEN     := 1024
PAPER_SAVE    := 2500
PAPER_POS_LEN := 4096
PAPER_CORPUS  :=
# one step at a time: GPT-2-small runs share one GPU's memory badly
PAPER_JOBS    := 1

.DEFAULT_GOAL := help
.PHONY: help install test test-fast lint docs figures figure-files record-built paper-figures previews bench clean distclean
# a recipe interrupted half-way must not leave a target that looks finished
.DELETE_ON_ERROR:

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

# The CPU build of torch goes in first, so that pip keeps it when it installs biasviz (pyproject asks only
# torch>=2.4, which on its own would pull the CUDA build and its packages onto a CPU machine). With your own
# torch already installed (a CUDA build, say): `make install TORCH=` skips this step.
TORCH ?= torch==2.13.0
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH),$(BIN)/python -m pip install --quiet '$(TORCH)')
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP)  ## create .venv and install biasviz with its test tools

test: $(STAMP)  ## run the whole test suite (CPU; CUDA tests skip without a GPU), a file at a time on two workers
	$(BIN)/python -m pytest tests src/biasviz -n 2 --dist loadfile --no-loadscope-reorder --durations=25

test-fast: $(STAMP)  ## the fast tests only (no subprocesses or end-to-end runs), in under 30 s
	$(BIN)/python -m pytest tests src/biasviz -m "not slow" -q

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check src tests bench

# The site reads the sources without importing them (mkdocstrings), so only the `docs` extra's own packages are
# installed (read from pyproject.toml), not torch: a fresh clone builds it in well under a minute.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['docs']))" \
		| xargs $(BIN)/python -m pip install --quiet
	@touch $@

docs: $(DOCS_STAMP)  ## build the documentation site into site/ (offline, strict: open site/index.html)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet

# `make` alone goes by time stamps; the manifest goes by content: before building, every target one of whose
# files something else replaced since the last build (a README example writing into figures/, say) is dated
# back so that it is rebuilt. Every step below runs with $(LOGGED): each file it writes is logged with its
# SHA-256 (src/biasviz/common/written.py), and after building, even a failed build, the manifest records
# them (src/biasviz/cli/manifest.py). `make clean` removes exactly those files while their content is the one
# recorded: never a file by its name, so a run or file of your own beside them (runs/mine, data/mine.h5, a
# `biasviz plot` of yours in figures/) is neither recorded nor removed.
MANIFEST := $(STAGES)/built.json
WRITTEN  := $(STAGES)/written.log
LOGGED    = BIASVIZ_WRITTEN_LOG=$(WRITTEN) BIASVIZ_WRITTEN_FOR=$@ BIASVIZ_PROGRESS_FOR=$(patsubst %/model.safetensors,%,$@)
FIGURE_FILES := $(FIGURES)/diagnostics.pdf $(foreach s,$(SCHEMES),$(FIGURES)/$(s)_bias.pdf $(FIGURES)/$(s)_explore.html) $(FIGURES)/$(DYNAMICS)_dynamics.pdf $(FIGURES)/long_context.pdf $(FIGURES)/positional.pdf $(FIGURES)/position_measures.pdf
# the manifest's tool, with or without .venv (make clean works without one)
MANIFEST_TOOL = $(if $(wildcard $(BIN)/python),$(BIN)/python,PYTHONPATH=src $(PYTHON)) -m biasviz.cli.manifest
# The steps run JOBS at a time (default: one per core, at most 4), each on THREADS of torch's threads, so that the
# cores are busy: a tiny model's training or summary keeps one core busy, not two. With JOBS above 1, progress
# comes as lines (a bar per step would fight over one terminal line), each naming the file it is for.
# `make figures JOBS=1` runs one step at a time, with bars. Your own OMP_NUM_THREADS wins over THREADS.
CORES   := $(shell nproc 2>/dev/null || echo 1)
JOBS    ?= $(shell n=$(CORES); [ $$n -gt 4 ] && n=4; echo $$n)
THREADS ?= $(shell t=$$(( $(CORES) / $(JOBS) )); [ $$t -lt 1 ] && t=1; echo $$t)
figures: $(STAMP)  ## train, extract and plot every figure set, the diagnostics, one explorer page per scheme, the training dynamics, the long-context figure, the positional logits of every scheme and the position measures of RoPE and ALiBi
	@$(BIN)/python -m biasviz.cli.manifest stale $(MANIFEST)
	@$(if $(filter-out 1,$(JOBS)),BIASVIZ_PROGRESS=lines )OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(THREADS)} \
		$(MAKE) --no-print-directory -j$(JOBS) figure-files; built=$$?; $(MAKE) --no-print-directory record-built; exit $$built

record-built:  # the manifest of what the build made (the files its steps logged)
	@$(MANIFEST_TOOL) record $(MANIFEST) $(WRITTEN) $(RUNS) $(DATA) $(FIGURES)

figure-files: $(FIGURE_FILES)

# Each command reads only its own part of a config: a per-stage copy that is rewritten only when that part
# changes, so editing [plot] re-plots without retraining. (The copy is refreshed on every run; cheap.)
$(STAGES)/%.train.json: configs/%.toml FORCE | $(STAMP)
	@$(BIN)/python -m biasviz.cli.options $< train $@
$(STAGES)/%.extract.json: configs/%.toml FORCE | $(STAMP)
	@$(BIN)/python -m biasviz.cli.options $< extract $@
$(STAGES)/%.plot.json: configs/%.toml FORCE | $(STAMP)
	@$(BIN)/python -m biasviz.cli.options $< plot $@

# (TRAIN_ARGS, when given, are a stage of their own: changing them retrains)
$(RUNS)/%/model.safetensors: $(STAGES)/%.train.json $(if $(TRAIN_ARGS),$(STAGES)/train-args.txt)
	$(LOGGED) $(BIASVIZ) train --config configs/$*.toml --out $(RUNS)/$* --force $(TRAIN_ARGS)$(if $(SAVE_EVERY), --save-every $(if $(filter $*,$(DYNAMICS)),$(SAVE_EVERY),0))
$(STAGES)/train-args.txt: FORCE
	@mkdir -p $(@D) && echo '$(TRAIN_ARGS) $(SAVE_EVERY)' | cmp -s - $@ || echo '$(TRAIN_ARGS) $(SAVE_EVERY)' > $@

$(DATA)/%.h5: $(RUNS)/%/model.safetensors $(STAGES)/%.extract.json
	$(LOGGED) $(BIASVIZ) extract --config configs/$*.toml --model $(RUNS)/$* --out $@ --force

$(FIGURES)/%_bias.pdf: $(DATA)/%.h5 $(STAGES)/%.plot.json
	$(LOGGED) $(BIASVIZ) plot --config configs/$*.toml --input $< --out-dir $(FIGURES) --force

# every checkpoint-STEP/ of the run, on the same 4 windows: one file with a leading checkpoint dimension
$(DATA)/%-sweep.h5: $(RUNS)/%/model.safetensors $(STAGES)/%.extract.json
	$(LOGGED) $(BIASVIZ) extract --config configs/$*.toml --model $(RUNS)/$* --checkpoints all --samples 4 --out $@ --force

$(FIGURES)/%_dynamics.pdf: $(DATA)/%-sweep.h5
	$(LOGGED) $(BIASVIZ) plot --scheme $* --input $< --kind dynamics --format pdf,png --out-dir $(FIGURES) --force

# far past the training length: summaries (mean maps, profiles, diagnostics) of 2 windows of LONG_LEN tokens
$(DATA)/%-long.h5: $(RUNS)/%/model.safetensors
	$(LOGGED) $(BIASVIZ) extract --model $(RUNS)/$* --summary --seq-len $(LONG_LEN) --samples 2 --resolution 512 --out $@ --force

$(FIGURES)/long_context.pdf: $(foreach s,$(LONG),$(DATA)/$(s)-long.h5)
	$(LOGGED) $(BIN)/python -m biasviz.plotting.long_context $^ --train-len $(TRAIN_LEN) --out $(FIGURES)/long_context

# positional logits P (summaries of POS_SAMPLES windows) at the training length and at POS_LEN, side by side
$(DATA)/%-pos-short.h5: $(RUNS)/%/model.safetensors
	$(LOGGED) $(BIASVIZ) extract --model $(RUNS)/$* --summary --seq-len $(TRAIN_LEN) --samples $(POS_SAMPLES) --out $@ --force
$(DATA)/%-pos-long.h5: $(RUNS)/%/model.safetensors
	$(LOGGED) $(BIASVIZ) extract --model $(RUNS)/$* --summary --seq-len $(POS_LEN) --samples $(POS_SAMPLES) --resolution 256 --out $@ --force

$(FIGURES)/positional.pdf: $(foreach s,$(POSITIONAL),$(DATA)/$(s)-pos-short.h5 $(DATA)/$(s)-pos-long.h5)
	$(LOGGED) $(BIN)/python -m biasviz.plotting.positional_compare $^ --out $(FIGURES)/positional --note "$(POS_NOTE)"

$(FIGURES)/position_measures.pdf: $(foreach s,$(MEASURES),$(DATA)/$(s)-pos-long.h5)
	$(LOGGED) $(BIN)/python -m biasviz.plotting.measures_page $^ --train-len $(TRAIN_LEN) --out $(FIGURES)/position_measures --caption

# one self-contained, interactive page per scheme (README, "Explorer")
$(FIGURES)/%_explore.html: $(DATA)/%.h5
	$(LOGGED) $(BIASVIZ) explore $< --out $@ --force

$(FIGURES)/diagnostics.pdf: $(foreach s,$(SCHEMES),$(DATA)/$(s).h5)
	$(LOGGED) $(BIASVIZ) diagnose $^ --json $(FIGURES)/diagnostics.json --force --out-dir $(FIGURES)

# The figure sets of `make figures` from GPT-2-small variants: the same rules, run with paper/ folders and options.
paper-figures: $(STAMP)  ## train GPT-2-small variants (needs a GPU; duration not measured) and draw the same figures into paper/figures/
	@$(MAKE) --no-print-directory figures RUNS=$(PAPER)/runs DATA=$(PAPER)/data FIGURES=$(PAPER)/figures \
		TRAIN_LEN=$(PAPER_LEN) POS_LEN=$(PAPER_POS_LEN) SAVE_EVERY=$(PAPER_SAVE) JOBS=$(PAPER_JOBS) \
		TRAIN_ARGS="--preset gpt2-small --steps $(PAPER_STEPS) --seq-len $(PAPER_LEN)$(if $(PAPER_CORPUS), --corpus $(PAPER_CORPUS))" \
		POS_NOTE="GPT-2-small models, $(PAPER_STEPS) steps on $(PAPER_LEN)-token windows of $(or $(PAPER_CORPUS),Python's standard library)"

previews: figures  ## refresh the small PNG previews shown in README (figures/preview/)
	$(BIN)/python -m biasviz.plotting.preview $(FIGURES) $(FIGURES)/preview
	$(BIN)/python -m biasviz.explorer.screenshot $(FIGURES)/kerple-log_explore.html $(FIGURES)/preview/explore_grid.png --select kind=weights --head 3
	$(BIN)/python -m biasviz.explorer.screenshot $(FIGURES)/kerple-log_explore.html $(FIGURES)/preview/explore_focus.png --select kind=weights --enlarge 4 --zoom 0.55,0.62,0.5,0.57 --cell 0.5,0.4

.PRECIOUS: $(RUNS)/%/model.safetensors $(DATA)/%.h5 $(DATA)/%-sweep.h5 $(DATA)/%-long.h5 $(DATA)/%-pos-short.h5 $(DATA)/%-pos-long.h5 $(STAGES)/%.train.json $(STAGES)/%.extract.json $(STAGES)/%.plot.json
FORCE:

bench: $(STAMP)  ## benchmarks, run by hand (not in CI; peers in bench/.venvs/, see BENCHMARKS.md)
	$(BIN)/python bench/train_speed.py
	$(BIN)/python bench/extract_peers.py --seq-len 512 2048 4096
	$(BIN)/python bench/extract_peers.py --seq-len 8192 --tools biasviz-cap biasviz --runs 1 --long-runs 1
	$(BIN)/python bench/hdf5_write.py
	$(BIN)/python bench/bench_plot.py
	$(BIN)/python bench/bench_explore.py --seq-len 1024 4096

clean:  ## remove the checkpoints, HDF5 files and figures `make figures` made, and nothing of yours (keeps .venv)
	@$(MANIFEST_TOOL) clean $(MANIFEST) $(WRITTEN) $(RUNS) $(DATA) $(FIGURES)
	rm -rf $(STAGES)
	@rmdir $(RUNS) 2>/dev/null || true

distclean: clean  ## also remove .venv and the built site
	rm -rf site
	rm -rf $(VENV)
