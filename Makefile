# The two set-up commands of the README, and helpers. Models go to ~/.cache/corelm/models
# (override with CORELM_MODELS_DIR); they are never part of the repository.

.PHONY: demo test test-arm lint models deps bench-compare bench-serve

# Build, fetch the default model if missing, and generate text with it.
demo: deps
	python3 scripts/fetch_models.py smollm2
	cargo run --release -q -p corelm-cli -- run --chat -n 96 --temp 0 \
		-p "Explain in two sentences why the sky is blue."

# Fetch every golden model, then run the whole test suite (release mode: the golden tests run
# real models), then check that no x86 intrinsic was left out of line in the binary, then the
# official `openai` Python client against `corelm serve`, then the aarch64 kernel parity tests
# and SmolLM2 golden check under qemu (installs its toolchain), then the kernel parity tests and
# the golden models' greedy text on an emulated x86 CPU without AVX-512.
test: deps models
	cargo test --release --workspace
	bash scripts/check_intrinsics_inlined.sh
	bash scripts/test_openai_client.sh
	bash scripts/test_arm.sh
	bash scripts/test_avx2_cpu.sh

# Clippy on every crate and test, warnings as errors (not part of `make test`: a newer
# toolchain's new lints must not turn CI red; run it before committing).
lint:
	cargo clippy --release --workspace --all-targets -- -D warnings

# Only the emulated aarch64 part of `make test`.
test-arm: models
	bash scripts/test_arm.sh

# hwloc and libudev for the topology reader (apt, only when missing).
deps:
	bash scripts/install_deps.sh

models:
	python3 scripts/fetch_models.py all

# Side by side with llama.cpp's llama-bench (build it as the script's docstring says; point
# LLAMA_BENCH at it). ISA=avx2 forces corelm's AVX2 table.
bench-compare: models
	python3 scripts/bench_compare.py --llama-bench "$(LLAMA_BENCH)" $(if $(ISA),--isa $(ISA))
