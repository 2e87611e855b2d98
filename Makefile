# Developer entry points. Every target that runs project code goes through .venv, which
# tools/bootstrap.sh makes (and skips when it is newer than pyproject.toml).

VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv demo test lint bench bench-gpu clean distclean

venv:
	tools/bootstrap.sh

demo: venv
	$(BIN)/qpolicy demo

# lint first: a type error is cheaper to read than the test failure it causes.
# setup-ebpf makes the host eBPF tier runnable when root (tests/ebpf skip themselves otherwise).
# setup-prometheus installs the Prometheus server that tests/grafana query (as root).
test: lint
	tools/setup-ebpf.sh
	tools/setup-prometheus.sh
	$(BIN)/python -m pytest tests

lint: venv
	$(BIN)/ruff check qpolicy tests tools
	$(BIN)/mypy --strict qpolicy

bench: venv
	$(BIN)/python tools/bench/run.py

# On a GPU machine, as root, with the system Python that has PyTorch (no venv there): native
# time-slicing vs MPS vs the rm enforcer. ARGS go to tools/bench/gpu.py.
bench-gpu:
	tools/gpu/bench-gpu.sh $(ARGS)

# Build outputs and caches; the venv stays (rebuilding it needs the network): see distclean.
clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis \
		bench-results qpolicy-demo.png
	find qpolicy tests tools -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
