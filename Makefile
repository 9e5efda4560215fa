# Thin wrapper around CMake. `make run` and `make test` do all set-up on a fresh Debian 12 machine.
BUILD      ?= build
BUILD_ASAN ?= build-asan
JOBS       ?= $(shell nproc)
# Debian packages the build and the tests need (installed by `make deps` when missing; node and npm
# from elsewhere, e.g. NodeSource, which conflicts with Debian's npm package, count as present).
DEB_PACKAGES = g++ cmake make pkg-config libgtest-dev libbenchmark-dev nlohmann-json3-dev \
               libcli11-dev libfmt-dev libpcre2-dev \
               libcpp-httplib-dev libssl-dev ca-certificates zlib1g-dev libbrotli-dev libboost-dev curl python3 \
               libzmq3-dev cppzmq-dev libmsgpack-cxx-dev python3-zmq python3-msgpack nginx haproxy \
               libhiredis-dev redis-server libucx-dev nodejs npm python3-jsonschema \
               libjpeg62-turbo-dev libpng-dev libwebp-dev libgif-dev python3-pil python3-torch \
               libavformat-dev libavcodec-dev libswscale-dev libavutil-dev ffmpeg
DEMO_MODEL ?= $(BUILD)/demo-model

.PHONY: all deps configure build test test-asan run clean soak bench-kernels bench-structured validator sdk-clients

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  case $$p in nodejs) command -v node >/dev/null && continue;; npm) command -v npm >/dev/null && continue;; esac; \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "error: need root to apt-get install:$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The structured-output tests validate generated JSON with an independent validator: ajv and
# ajv-formats (npm, pinned in tests/tools/ajv/package.json) in tests/tools/ajv/node_modules; when npm
# cannot be reached they fall back to Debian's python3-jsonschema (tests/tools/ajv/validate.py).
validator: deps
	@[ -d tests/tools/ajv/node_modules/ajv-formats ] || (cd tests/tools/ajv && npm install --no-audit --no-fund --silent) || \
	  echo "warning: npm install failed; the structured-output tests validate with python3-jsonschema instead"


# The official OpenAI and Anthropic SDKs (npm, pinned in tests/tools/sdk/package-lock.json) under the build
# dir, for tests/cli/server_agent_apis.sh. Needs registry.npmjs.org once; without it that test fails saying so.
sdk-clients: deps
	@[ -d $(BUILD)/sdk-clients/node_modules/@anthropic-ai/sdk ] || ( mkdir -p $(BUILD)/sdk-clients && \
	  cp tests/tools/sdk/package.json tests/tools/sdk/package-lock.json $(BUILD)/sdk-clients/ && \
	  cd $(BUILD)/sdk-clients && npm ci --no-audit --no-fund --silent ) || \
	  echo "warning: npm could not install the SDKs (registry unreachable?); cli.server_agent_apis will fail" >&2

# Whole suite (release build), then the loader/format tests again under ASan+UBSan.
test: build validator sdk-clients
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) test-asan

test-asan: deps
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DM3_SANITIZE=ON >/dev/null
	cmake --build $(BUILD_ASAN) -j $(JOBS) --target loader_tests
	OMP_WAIT_POLICY=passive ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(BUILD_ASAN)/tests/loader_tests

# Build, then serve the built-in demo model (models/demo) on 127.0.0.1:8000. While the trained demo
# checkpoint is not in the tree, a small random-weight M3.1-layout model is generated instead (it
# speaks noise, but every endpoint works).
run: build
	@if [ -f models/demo/config.json ]; then model=models/demo; else \
	  model=$(DEMO_MODEL); \
	  if [ ! -f $(DEMO_MODEL)/config.json ]; then \
	    $(BUILD)/m3serve make-model --layout m31 --preset tiny --seed 1 --out $(DEMO_MODEL) && \
	    cp tests/data/chat/MiniMax-M3.jinja $(DEMO_MODEL)/chat_template.jinja; \
	  fi; \
	fi; \
	echo "serving $$model on http://127.0.0.1:8000"; \
	exec $(BUILD)/m3serve serve $$model --host 127.0.0.1 --port 8000 \
	  --reasoning-parser minimax_m3 --tool-call-parser minimax_m3 --enable-auto-tool-choice

# Soak (not part of make test): 64 streaming clients for 60 s against a tiny model; every token
# checked against a greedy reference, RSS printed. SOAK_CLIENTS / SOAK_SECONDS override.
soak: build
	tools/soak.sh $(BUILD)/m3serve

# Kernel micro-benchmarks (Google Benchmark): every weight format, decode (T=1) and batched (T=8),
# hot (in cache) and cold (memory-bound). BENCH_ARGS passes Google Benchmark flags.
bench-kernels: build
	cmake --build $(BUILD) -j $(JOBS) --target kernels_bench
	OMP_WAIT_POLICY=active $(BUILD)/kernels_bench $(BENCH_ARGS)

# Structured outputs: grammar compile time and mask cost per step at vocabulary 200K (o200k).
bench-structured: build
	cmake --build $(BUILD) -j $(JOBS) --target structured_bench
	$(BUILD)/structured_bench $(BENCH_ARGS)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN)

# Rebuilds the built-in demo model (models/demo, its DSpark draft and tests/data/demo) from scratch on the CPU:
# Debian packages (torch, numpy, jinja2, regex, OpenBLAS, the KJV text), data, tokenizer, training, export,
# verification against m3serve (logits, perplexity, tool calls through the server). About 2 hours on 2
# shared cores; see tools/train/README.md.
DEMO_TRAIN_PACKAGES = python3-torch python3-numpy python3-jinja2 python3-regex bible-kjv bible-kjv-text \
                      libopenblas0-pthread
DEMO_PY = nice -n 19 /usr/bin/python3
.PHONY: demo-model
demo-model: build
	@missing=""; for p in $(DEMO_TRAIN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "error: need root to apt-get install:$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	cd tools/train && $(DEMO_PY) data.py && $(DEMO_PY) bpe.py && \
	  $(DEMO_PY) train.py --steps 330 --batch 8 --seq 512 --lr 3e-3 --threads 1 && \
	  cp work/ckpt.pt work/ckpt_stage1.pt && \
	  $(DEMO_PY) train.py --init work/ckpt_stage1.pt --steps 180 --batch 8 --seq 512 --lr 1.5e-3 \
	    --conv-frac 0.8 --seed 2 --threads 1 && \
	  cp work/ckpt.pt work/ckpt_stage2.pt && $(DEMO_PY) data.py stage3 6000 && \
	  $(DEMO_PY) train.py --init work/ckpt_stage2.pt --steps 100 --batch 4 --seq 1024 --lr 1e-3 \
	    --qat-from 0.8 --seed 3 --threads 1 --mix train_kjv:0.18,train_conv:0.12,train3_conv:0.70 && \
	  export M3SERVE=$(abspath $(BUILD))/m3serve && \
	  $(DEMO_PY) export.py && $(DEMO_PY) evaluate.py --write-tests && \
	  $(DEMO_PY) eval_server.py --tasks 200 --write-test 30 && \
	  $(DEMO_PY) dspark.py && $(DEMO_PY) dspark_golden.py
