# Developer entry points. Every target that runs project code goes through .venv, which
# tools/bootstrap.sh makes (and skips when it is newer than pyproject.toml).

VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv demo test vm-test lint bench bench-vm bench-gpu clean distclean

venv:
	tools/bootstrap.sh

demo: venv
	$(BIN)/qpolicy demo

# lint first: a type error is cheaper to read than the test failure it causes.
# setup-ebpf makes the host eBPF tier runnable when root (tests/ebpf skip themselves otherwise).
# setup-prometheus installs the Prometheus server that tests/grafana query (as root).
# Then the VM tier: nvmock.ko and the kernel-side tests in a QEMU VM (tests/vm).
test: lint
	tools/setup-ebpf.sh
	tools/setup-prometheus.sh
	$(BIN)/python -m pytest tests
	$(MAKE) vm-test

# The kernel tier in a VM booting Debian's 6.1 kernel (tools/vm/run installs what it needs: the
# kernel, its headers, QEMU, virtme-ng; as root). Boot and tests take about three minutes.
vm-test: venv
	tools/vm/run env QPOLICY_IN_VM=1 PYTHONDONTWRITEBYTECODE=1 \
		$(BIN)/python -m pytest -p no:cacheprovider tests/vm

lint: venv
	$(BIN)/ruff check qpolicy tests tools
	$(BIN)/mypy --strict qpolicy
	tools/checkpatch.sh

bench: venv
	$(BIN)/python tools/bench/run.py

# qgpu.ko in the VM against the unhooked mock driver: cost per ioctl, shares, online latency.
bench-vm: venv
	$(MAKE) -s -C tools/bench/ioctlbench
	tools/vm/run env PYTHONDONTWRITEBYTECODE=1 $(BIN)/python tools/bench/qgpu_vm.py

# On a GPU machine, as root, with the system Python that has PyTorch (no venv there): native
# time-slicing vs MPS vs the rm enforcer. ARGS go to tools/bench/gpu.py.
bench-gpu:
	tools/gpu/bench-gpu.sh $(ARGS)

# Build outputs and caches; the venv stays (rebuilding it needs the network): see distclean.
clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis \
		bench-results qpolicy-demo.png
	find qpolicy tests tools -name __pycache__ -type d -prune -exec rm -rf {} +
	$(MAKE) -s -C kmod clean
	$(MAKE) -s -C tools/gpuload clean
	$(MAKE) -s -C tools/bench/ioctlbench clean

distclean: clean
	rm -rf $(VENV)
