# The two commands of the README: `make book` and `make test`. Both create .venv here first.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# This machine's pip configuration prints a harmless warning per package; keep the log readable.
QUIET_PIP := grep -v '^WARNING: Location' || true

.PHONY: venv system-deps lint test test-fast test-repeat test-chapter page book bench clean hub hub-clean

venv: $(STAMP)

$(STAMP): requirements.txt hub/requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt 2>&1 | $(QUIET_PIP)
	$(PY) -m pip install --quiet --no-deps -e . 2>&1 | $(QUIET_PIP)
	$(PY) -m pip check 2>&1 | $(QUIET_PIP)
	@if $(PY) -m pip list 2>/dev/null | grep -iE '^nvidia-|^torch .*\+cu'; then \
		echo "error: a CUDA build of torch was installed; the course pins the CPU build"; exit 1; fi
	touch $(STAMP)

system-deps:
	bash scripts/install-system-deps.sh

# The course hub's proxy, pinned in hub/package-lock.json, installed into hub/node_modules.
PROXY := hub/node_modules/.bin/configurable-http-proxy
$(PROXY): hub/package.json hub/package-lock.json | system-deps
	npm ci --prefix hub --no-audit --no-fund --loglevel=error
	touch $(PROXY)

# The demo course (hub/README.md): private Slurm cluster, accounts, hub on 127.0.0.1. Ctrl-C ends it;
# from a script, SIGTERM to make (make passes it on to demo.py) or to demo.py.
# STUDENTS=N makes N student accounts and sizes the cluster so that each gets a server at once;
# COURSE names the accounts (COURSE-student1 ...).
STUDENTS ?= 3
COURSE ?= dlc
hub: $(STAMP) system-deps $(PROXY)
	$(PY) hub/demo.py up --students $(STUDENTS) --course $(COURSE)

# Remove the demo course's Unix accounts (and their homes).
hub-clean: $(STAMP)
	$(PY) hub/demo.py clean --course $(COURSE)

# pyflakes, import order and bugbear over the code, tests and benchmarks (rules: pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache .

# Byte-code of the package, written once: where PYTHONDONTWRITEBYTECODE is set (this machine
# sets it), every process that imports distlab (each rank, kernel, grader) would compile it again.
BYTECODE := $(PY) -m compileall -q src

# Two workers, one test file each at a time (files share module-scoped fixtures: the built
# book, the graded class, the Slurm cluster); tests/conftest.py starts the longest files first.
# `make test CHAPTER=<slug>` is `make test-chapter CHAPTER=<slug>` (below).
test: $(if $(CHAPTER),test-chapter,$(STAMP) system-deps lint $(PROXY))
	@if [ -z "$(CHAPTER)" ]; then $(BYTECODE) && $(PY) -m pytest -n 2 --dist loadfile --durations=30; fi

# The browser and hub tests, N runs in a row, to see whether they pass every time (a test that
# passes 4 runs in 5 fails CI one time in 5). Each run is a new pytest process: its hub, Slurm
# cluster, browser and book are started anew. Logs: artifacts/repeat/run-K.log. The hubs' courses
# get a tag (accounts dltr-student1..., tests/hub/hub_support.py), so this may run beside a make test.
# The default is every file that starts a hub or a browser; test_book's first run executes the
# whole book (minutes), later runs take its pages from the cache and drive the browser again.
#   make test-repeat FILES="tests/hub/test_hub.py tests/hub/test_exchange.py" N=5
N ?= 5
FILES ?= tests/hub/test_hub.py tests/hub/test_exchange.py tests/hub/test_course_sessions.py tests/hub/test_hub_class.py \
	tests/book/test_book.py
test-repeat: $(STAMP) system-deps $(PROXY)
	$(BYTECODE)
	@mkdir -p artifacts/repeat; failed=0; \
	for run in $$(seq 1 $(N)); do \
		start=$$(date +%s); log=artifacts/repeat/run-$$run.log; \
		if DISTLAB_TEST_COURSE_TAG=r $(PY) -m pytest -p no:cacheprovider $(FILES) > $$log 2>&1; then verdict=passed; \
		else verdict=FAILED; failed=$$((failed + 1)); fi; \
		echo "run $$run of $(N): $$verdict in $$(( $$(date +%s) - start )) s: $$(tail -n 1 $$log)"; \
	done; \
	echo "$(FILES): $$(( $(N) - failed )) of $(N) runs passed"; test $$failed -eq 0

# One chapter's gates, grading included, in minutes: every page of the chapter executed and
# checked as `make page` does; its own tests (tests/chapters/test_chapterNN.py); the release and grading
# gates of tests/grade/test_grading.py and its independent-task grading (tests/grade/test_independent_grading.py)
# for it alone (DISTLAB_TEST_CHAPTER); the package's checks (tests/book/test_package.py,
# tests/book/test_package_copy.py); and the registry against the disk (tests/chapters/test_chapters.py).
#   make test-chapter CHAPTER=03-ddp
CHAPTER ?=
test-chapter: $(STAMP)
	@test -n "$(CHAPTER)" -a -f "solutions/$(CHAPTER)/$(CHAPTER).ipynb" || { \
		echo "usage: make test-chapter CHAPTER=<one of: $$(ls solutions | tr '\n' ' ')>"; exit 2; }
	$(BYTECODE)
	$(PY) -m distlab.grade page --chapter $(CHAPTER)
	DISTLAB_TEST_CHAPTER=$(CHAPTER) $(PY) -m pytest -n 2 --dist loadfile tests/grade/test_grading.py \
		$(if $(shell grep -l '"$(CHAPTER)"' tests/grade/test_independent_grading.py),tests/grade/test_independent_grading.py) \
		tests/chapters/test_chapters.py tests/book/test_package.py tests/book/test_package_copy.py \
		$(wildcard tests/chapters/test_chapter$(shell echo $(CHAPTER) | cut -c1-2).py)

# One page, executed with the book's settings and its execution cache (a page run here is not run
# again by `make book`), then checked: glossary links, dotted distlab names, no graded solution or
# reference shown, outputs without errors or warnings (src/distlab/grade/author/page_check.py).
#   make page PAGE=book/03-ddp/buckets.md
PAGE ?=
page: $(STAMP)
	@test -n "$(PAGE)" || { echo "usage: make page PAGE=book/<folder>/<page>.md"; exit 2; }
	@$(BYTECODE)
	$(PY) -m distlab.grade page $(PAGE)

# The quick loop: everything but the slow tests (many ranks, timeouts, concurrency).
test-fast: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -m "not slow"

# Executes every page (jupyter-cache in _build/.jupyter_cache keeps outputs of unchanged pages;
# a change in src/distlab clears it, see book/_ext/distlab_book.py); warnings are errors.
book: $(STAMP)
	@$(BYTECODE)
	@start=$$(date +%s); status=0; \
	$(VENV)/bin/jupyter-book build . -W --keep-going || status=$$?; \
	if [ $$status -eq 0 ]; then \
		echo "book built in $$(( $$(date +%s) - start )) s: _build/html/index.html"; \
	else \
		echo "book build FAILED after $$(( $$(date +%s) - start )) s (exit $$status)"; fi; \
	exit $$status

bench: $(STAMP)
	$(PY) benchmarks/launch.py

clean:
	rm -rf _build

# -- Grading (issue 5): the instructor's commands, see book/appendices/instructors-guide.md ----
# SLUG=00-first-steps, FROM=folder of submissions (one <student_id>.zip or folder each).
SLUG ?= 00-first-steps
GRADE := $(PY) -m distlab.grade
.PHONY: grade-release grade-collect grade-autograde grade-feedback grade-export grade-class bench-autograde \
	student-edition

grade-release: $(STAMP)
	$(GRADE) release

grade-collect: $(STAMP)
	$(GRADE) collect $(SLUG) --from "$(FROM)"

grade-autograde: $(STAMP)
	$(GRADE) autograde $(SLUG)

grade-feedback: $(STAMP)
	$(GRADE) feedback $(SLUG)

grade-export: $(STAMP)
	$(GRADE) export

grade-class: $(STAMP)
	$(GRADE) class $(SLUG) --from "$(FROM)"

bench-autograde: $(STAMP)
	$(PY) benchmarks/autograde.py

# The student edition, what the site, the launch links and the public repository are made of
# (README, "Publishing: two editions"): a new repository without solutions/, grader/ and tests/,
# nor their history. Then push it:  git -C DEST push <public repository> main
#   make student-edition DEST=../distlab-public
DEST ?=
student-edition: $(STAMP)
	@test -n "$(DEST)" || { echo "usage: make student-edition DEST=<a new folder, or an earlier edition>"; exit 2; }
	$(GRADE) student-edition "$(DEST)"
