# The two set-up commands of the README, and helpers. Models go to ~/.cache/corelm/models
# (override with CORELM_MODELS_DIR); they are never part of the repository.

.PHONY: demo test models bench-compare bench-serve

# Build, fetch the default model if missing, and generate text with it.
demo:
	python3 scripts/fetch_models.py smollm2
	cargo run --release -q -p corelm-cli -- run --chat -n 96 --temp 0 \
		-p "Explain in two sentences why the sky is blue."

# Fetch every golden model, then run the whole test suite (release mode: the golden tests run
# real models), then the official `openai` Python client against `corelm serve`.
test: models
	cargo test --release --workspace
	bash scripts/test_openai_client.sh

models:
	python3 scripts/fetch_models.py all

# Side by side with llama.cpp (needs the llama-cpp-python venv described in the script).
bench-compare: models
	python3 scripts/bench_compare.py
