# gpuq: the two commands a new user needs are `make demo` and `make test`.
# Both set themselves up: Debian packages (as root, via apt-get), a virtualenv in .venv, the project.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEB_STAMP := .deb-installed
DEB_PACKAGES := prometheus prometheus-alertmanager chromium
# the commands those packages give, checked before apt-get is asked
DEB_COMMANDS := promtool amtool chromium

.PHONY: test demo setup deb lint bench clean alerts helm-template

$(DEB_STAMP):
	@missing=0; for c in $(DEB_COMMANDS); do command -v $$c >/dev/null 2>&1 || missing=1; done; \
	if [ "$$missing" = "0" ]; then \
	  echo "debian packages already present"; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEB_PACKAGES)) \
	    || echo "WARNING: apt-get could not install $(DEB_PACKAGES); tests needing them will say so"; \
	else \
	  echo "WARNING: not root or no apt-get: install $(DEB_PACKAGES) yourself for the alert-rule and browser tests"; \
	fi
	@touch $(DEB_STAMP)

deb: $(DEB_STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test,dashboards]"
	@touch $(STAMP)

setup: $(STAMP) $(DEB_STAMP)

# each fails on any finding: ruff and mypy as pyproject.toml configures them (mypy strict on the
# pure cores), then the import-linter contracts
lint: $(STAMP)
	$(BIN)/ruff check --no-cache .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# two workers, each taking whole test modules (their module fixtures start once), the modules with
# real Ray all on one (tests/conftest.py): the tests wait on subprocesses much of the time, so two
# on two cores take about 9 minutes where one took 15. TEST_WORKERS=0 runs them in this process.
# Then the tests marked `alone` (the demo's books against the scheduler's events), by themselves:
# beside another worker, the scheduler's cycle lagged the collectors by more than a round.
TEST_WORKERS ?= 2
test: setup lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup -m "not alone"
	$(BIN)/python -m pytest -q -p no:cacheprovider -m alone

demo: setup
	$(BIN)/gpuq demo

bench: setup
	$(BIN)/python -m benchmarks.run_all

# the PrometheusRule the Helm chart ships, rendered from alerts/gpuq.rules.yml
alerts: $(STAMP)
	$(BIN)/python alerts/render.py

# the Helm chart as `helm template` prints it (Helm's engine from helm-python-sdk; no helm binary
# needed): make helm-template VALUES=my-values.yaml
helm-template: $(STAMP)
	@$(BIN)/python -c 'import sys, yaml; from helm_python import Chart; \
	v = yaml.safe_load(open(sys.argv[1])) if sys.argv[1] else {}; \
	c = Chart.load("deploy/helm/gpuq"); out = c.render(values=v, name="gpuq", namespace="gpuq"); \
	print("\n".join("---\n# Source: " + k + "\n" + t.strip() for k, t in sorted(out.items()) if t.strip() and not k.endswith("NOTES.txt")))' "$(VALUES)"

clean:
	rm -rf $(VENV) $(DEB_STAMP) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
