# kvq — build, test, demo.
#
#   make              library (static + shared) and the kvq binary in build/
#   make test         install missing deps, build with -Werror, run every test
#   make demo         install missing deps, fetch SmolLM2-135M, run the pipeline on real text
#   make CUDA=1       also build the GPU backend (nvcc, cuBLAS, cuSOLVER) in build-cuda/
#   make test-python  the Python package with torch/transformers (python/tests/test_hf.py)
#   make test-report  python -m kvq report on a real calibration, in headless Chromium
#   make test-cuda    build with CUDA=1 and check every CUDA path against the CPU
#                     (scripts/test-cuda.sh; every case is skipped without a GPU)
#   make test-device-kit  build .device-kit/ for a bare GPU machine and check it here
#                     (docs/cuda.md: the device command and what it carries)
#   make MPI=0        build kvq without MPI even when OpenMPI is installed (docs/mpi.md)
#   make asan         run the tests under AddressSanitizer + UBSan (build-asan/)
#   make fuzz         run every libFuzzer target for FUZZ_TIME seconds (clang)
#   make bench        build the benchmarks (see docs/BENCHMARKS.md)
#   make deps         install missing Debian/PyPI dependencies (scripts/install-deps.sh)
#   make install      PREFIX (default /usr/local; DESTDIR too): lib/libkvq.so.X.Y.Z
#                     (SONAME libkvq.so.X), libkvq.a, bin/kvq, the stable headers and
#                     lib/pkgconfig/kvq.pc; `make install-unstable` adds the unstable
#                     tier's headers (docs/api.md); `make uninstall` removes them
#
# Knobs (all ?=): CUDA MPI DEBUG WERROR SAN CC NVCC PYTHON FUZZ_TIME KVQ_TEST_MODEL KVQ_SMOLLM2
#                 CUDA_SMS BENCH_MARCH

CUDA      ?= 0
DEBUG     ?= 0
WERROR    ?= 0
SAN       ?= 0
CC        ?= cc
PYTHON    ?= python3
FUZZ_TIME ?= 60
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
# Every real architecture from sm_70 up that this nvcc can build (`nvcc --list-gpu-code`;
# CUDA 13 dropped sm_70/72), plus PTX for the newest so that a newer GPU JIT-compiles it.
# A GPU that none of these runs on falls back to the CPU with one line (common/cuda/device.cu).
# (An nvcc without --list-gpu-code, before CUDA 11: sm_80 and sm_90.)
CUDA_SMS_FOUND = $(shell $(NVCC) --list-gpu-code 2>/dev/null | sed -n 's/^sm_\([0-9]*\)$$/\1/p' | \
               awk '$$1 >= 70' | sort -n -u | tr '\n' ' ')
CUDA_SMS  ?= $(or $(strip $(CUDA_SMS_FOUND)),80 90)
CUDA_ARCH ?= $(foreach a,$(CUDA_SMS),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(lastword $(CUDA_SMS)),code=compute_$(lastword $(CUDA_SMS))
KVQ_TEST_MODEL ?= ../shared/models/stories260K.gguf
export KVQ_TEST_MODEL
# SmolLM2-135M-Instruct Q4_1 for the golden tests (tests/test_smollm2.c); empty: `make
# test` runs scripts/fetch-model.sh (fetching it into .cache/models/ when missing).
KVQ_SMOLLM2 ?=
export KVQ_SMOLLM2

ifeq ($(SAN),1)
  BUILD ?= build-asan
else ifeq ($(CUDA),1)
  BUILD ?= build-cuda
else
  BUILD ?= build
endif

# ---- dependencies (pkg-config names) -------------------------------------------
DEP_PKGS := openblas lapacke libzstd libcjson
TEST_PKGS := cmocka
have_pkg = $(shell pkg-config --exists $(1) 2>/dev/null && echo yes)
MISSING := $(foreach p,$(DEP_PKGS) $(TEST_PKGS),$(if $(call have_pkg,$(p)),,$(p)))

DEP_CFLAGS := $(shell pkg-config --cflags $(DEP_PKGS) 2>/dev/null)
DEP_LIBS   := $(shell pkg-config --libs $(DEP_PKGS) 2>/dev/null)
TEST_LIBS  := $(shell pkg-config --libs $(TEST_PKGS) 2>/dev/null)

# ---- MPI (the kvq binary only: cli/dist.c; the library never links it) -----------------
# MPI=auto (default): on when pkg-config knows ompi-c or mpicc is on PATH; MPI=0: off.
MPI ?= auto
ifeq ($(MPI),0)
  HAVE_MPI :=
else
  HAVE_MPI := $(shell pkg-config --exists ompi-c 2>/dev/null && echo 1 || \
                (command -v mpicc >/dev/null 2>&1 && echo 1))
endif
ifeq ($(HAVE_MPI),1)
  MPI_CFLAGS := -DKVQ_HAVE_MPI=1 $(shell pkg-config --cflags ompi-c 2>/dev/null || mpicc --showme:compile)
  MPI_LIBS   := $(shell pkg-config --libs ompi-c 2>/dev/null || mpicc --showme:link)
endif
# cli/dist.c and the binary are rebuilt when the MPI setting changes.
MPI_STAMP := $(BUILD)/mpi.$(if $(HAVE_MPI),on,off)

# ---- flags -----------------------------------------------------------------------
OPT := -O2
ifeq ($(DEBUG),1)
  OPT := -O0
endif
WARN := -Wall -Wextra -Wshadow -Wno-unused-parameter -Wstrict-prototypes -Wvla
ifeq ($(WERROR),1)
  WARN += -Werror
endif
SANFLAGS :=
ifeq ($(SAN),1)
  SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
# KVQ_UNSTABLE_API: the library, the CLI, tests and benchmarks use the unstable tier
# of the headers (docs/api.md); the examples and installed programs need not.
CPPFLAGS := -Iinclude -I. -D_GNU_SOURCE -DKVQ_UNSTABLE_API $(DEP_CFLAGS)
CFLAGS   := -std=c11 $(OPT) -g -fPIC -fopenmp $(WARN) $(SANFLAGS)
LDLIBS   := $(DEP_LIBS) -lm -lpthread -fopenmp

# Files named *_avx2.c / *_avx512.c hold run-time dispatched SIMD paths.
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c

LIB_DIRS := common formats model calib cholesky codebook kmeans runtime eval thresholds pipeline
# runtime/'s sub-folders (CONTRIBUTING.md "The runtime"): the cache, the kernels per ISA,
# the selectors (one file each; the codebook selector's stages in a folder of its own)
RUNTIME_DIRS := runtime/cache runtime/kernels runtime/select runtime/select/codebook
LIB_SRC  := $(sort $(wildcard $(addsuffix /*.c,$(LIB_DIRS) $(RUNTIME_DIRS))))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)

ifeq ($(CUDA),1)
  CU_SRC  := $(sort $(wildcard $(addsuffix /cuda/*.cu,$(LIB_DIRS))))
  CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
  CPPFLAGS += -DKVQ_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcusolver -lcublas -lcudart
  NVFLAGS := -O2 -std=c++17 $(CUDA_ARCH) -Xcompiler -fPIC -Iinclude -I. -DKVQ_HAVE_CUDA=1 -DKVQ_UNSTABLE_API
else
  CU_OBJ :=
endif

CLI_SRC := $(sort $(wildcard cli/*.c))
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)

TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# tests/cuda/: the CUDA paths against the CPU, built (and run by test-run) with CUDA=1 only
CUDA_TEST_BIN := $(patsubst tests/cuda/%.c,$(BUILD)/tests/%,$(sort $(wildcard tests/cuda/test_*.c)))
ifeq ($(CUDA),1)
  TEST_BIN += $(CUDA_TEST_BIN)
endif
TEST_HELPER_SRC := $(sort $(wildcard tests/helpers/*.c))
TEST_HELPER_OBJ := $(TEST_HELPER_SRC:%.c=$(BUILD)/obj/%.o)

FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_REPLAY := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=$(BUILD)/fuzz/replay_%)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=build-fuzz/fuzz_%)

BENCH_SRC := $(sort $(wildcard bench/*.c))
# the benchmarks' own code is built for this CPU; scripts/device-kit.sh builds them for
# any AVX2 machine (-march=x86-64-v3) since they run on another one
BENCH_MARCH ?= -march=native
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

EXAMPLE_SRC := $(sort $(wildcard examples/*.c))
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)

STATIC := $(BUILD)/libkvq.a
SHARED := $(BUILD)/libkvq.so
KVQ    := $(BUILD)/kvq

# ---- version, SONAME, install --------------------------------------------------------
# The version is the one in include/kvq/common.h. The shared library is
# libkvq.so.MAJOR.MINOR.PATCH with SONAME libkvq.so.MAJOR (a new major version for an
# incompatible ABI), plus the two links libkvq.so.MAJOR and libkvq.so.
ver_field = $(shell sed -n 's/^\#define KVQ_VERSION_$(1) \([0-9]*\).*/\1/p' include/kvq/common.h)
KVQ_MAJOR   := $(call ver_field,MAJOR)
KVQ_VERSION := $(KVQ_MAJOR).$(call ver_field,MINOR).$(call ver_field,PATCH)
SONAME      := libkvq.so.$(KVQ_MAJOR)
PREFIX  ?= /usr/local
DESTDIR ?=
# Installed headers (docs/api.md): `make install` the stable tier (kvq.h and the
# headers below: their unstable parts need KVQ_UNSTABLE_API and the unstable tier);
# `make install-unstable` adds every other header but kvq/util.h, the library's
# internal helpers (the CLI, tests and benchmarks take it from the source tree).
STABLE_HEADERS   := $(addprefix include/kvq/,common.h artifact.h calibrate.h eval.h engine.h)
UNSTABLE_HEADERS := $(filter-out include/kvq/util.h $(STABLE_HEADERS),$(sort $(wildcard include/kvq/*.h)))

.PHONY: all lib test test-run test-cuda test-device-kit test-python test-report cuda-tests demo deps check-deps asan fuzz fuzz-replay bench examples clean help \
        install install-unstable uninstall

all: check-deps $(STATIC) $(SHARED) $(KVQ) $(EXAMPLE_BIN)

lib: $(STATIC) $(SHARED)

help:
	@sed -n '2,23p' Makefile | sed 's/^# \{0,1\}//'

# Prints what was found and stops early with a hint when something is missing.
check-deps:
	@printf 'kvq: deps:'; \
	for p in $(DEP_PKGS) $(TEST_PKGS); do \
	  if pkg-config --exists $$p 2>/dev/null; then printf ' %s=%s' $$p `pkg-config --modversion $$p`; \
	  else printf ' %s=MISSING' $$p; fi; done; \
	if [ "$(CUDA)" = 1 ]; then \
	  if [ -x "$(NVCC)" ]; then printf ' nvcc=%s' `$(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'`; \
	  else printf ' nvcc=MISSING'; fi; fi; echo
	@if [ -n "$(strip $(MISSING))" ]; then \
	  echo "kvq: missing: $(MISSING) — run 'make deps' (as root) to install them" >&2; exit 1; fi
	@if [ "$(CUDA)" = 1 ] && [ ! -x "$(NVCC)" ]; then \
	  echo "kvq: CUDA=1 but $(NVCC) not found (set CUDA_HOME)" >&2; exit 1; fi

deps:
	@bash scripts/install-deps.sh

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(if $(findstring _avx512,$<),$(AVX512_FLAGS),$(if $(findstring _avx2,$<),$(AVX2_FLAGS))) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(STATIC): $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(SHARED).$(KVQ_VERSION): $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,$(SONAME) $(SANFLAGS) -o $@ $^ $(LDLIBS) $(if $(CU_OBJ),-lstdc++)

$(SHARED): $(SHARED).$(KVQ_VERSION)
	ln -sf libkvq.so.$(KVQ_VERSION) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

# kvq.pc for pkg-config: `pkg-config --cflags --libs kvq` (shared), --static adds the
# dependencies of libkvq.a.
$(BUILD)/kvq.pc: Makefile include/kvq/common.h
	@mkdir -p $(dir $@)
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$${prefix}/lib' 'includedir=$${prefix}/include' '' \
	  'Name: kvq' 'Description: KV-cache codebook toolchain and retrieval-attention runtime' \
	  'Version: $(KVQ_VERSION)' 'Requires.private: $(DEP_PKGS)' \
	  'Libs: -L$${libdir} -lkvq' 'Libs.private: -lm -lpthread -fopenmp' \
	  'Cflags: -I$${includedir}' >$@

install: $(STATIC) $(SHARED) $(KVQ) $(BUILD)/kvq.pc
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include/kvq
	install -m 755 $(KVQ) $(DESTDIR)$(PREFIX)/bin/kvq
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/libkvq.a
	install -m 755 $(SHARED).$(KVQ_VERSION) $(DESTDIR)$(PREFIX)/lib/libkvq.so.$(KVQ_VERSION)
	ln -sf libkvq.so.$(KVQ_VERSION) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libkvq.so
	install -m 644 include/kvq.h $(DESTDIR)$(PREFIX)/include/kvq.h
	install -m 644 $(STABLE_HEADERS) $(DESTDIR)$(PREFIX)/include/kvq/
	sed 's|^prefix=.*|prefix=$(PREFIX)|' $(BUILD)/kvq.pc >$(DESTDIR)$(PREFIX)/lib/pkgconfig/kvq.pc

# The unstable tier's headers too (a program using them defines KVQ_UNSTABLE_API and
# is rebuilt for every kvq release).
install-unstable: install
	install -m 644 $(UNSTABLE_HEADERS) $(DESTDIR)$(PREFIX)/include/kvq/

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/kvq $(DESTDIR)$(PREFIX)/lib/libkvq.a \
	  $(DESTDIR)$(PREFIX)/lib/libkvq.so $(DESTDIR)$(PREFIX)/lib/$(SONAME) \
	  $(DESTDIR)$(PREFIX)/lib/libkvq.so.$(KVQ_VERSION) $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvq.pc \
	  $(DESTDIR)$(PREFIX)/include/kvq.h $(STABLE_HEADERS:include/%=$(DESTDIR)$(PREFIX)/include/%) \
	  $(UNSTABLE_HEADERS:include/%=$(DESTDIR)$(PREFIX)/include/%)
	-rmdir $(DESTDIR)$(PREFIX)/include/kvq

$(KVQ): $(CLI_OBJ) $(STATIC) $(MPI_STAMP)
	$(CC) $(SANFLAGS) -o $@ $(CLI_OBJ) $(STATIC) $(LDLIBS) $(MPI_LIBS) $(if $(CU_OBJ),-lstdc++)

$(BUILD)/obj/cli/dist.o: CPPFLAGS += $(MPI_CFLAGS)
$(BUILD)/obj/cli/dist.o: $(MPI_STAMP)
$(MPI_STAMP):
	@mkdir -p $(dir $@) && rm -f $(BUILD)/mpi.on $(BUILD)/mpi.off && touch $@

$(TEST_HELPER_OBJ): CPPFLAGS += -Itests

$(BUILD)/tests/%: tests/%.c $(TEST_HELPER_OBJ) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -o $@ $< $(TEST_HELPER_OBJ) $(STATIC) $(LDLIBS) $(TEST_LIBS) $(if $(CU_OBJ),-lstdc++)

$(BUILD)/tests/%: tests/cuda/%.c $(TEST_HELPER_OBJ) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -o $@ $< $(TEST_HELPER_OBJ) $(STATIC) $(LDLIBS) $(TEST_LIBS) -lstdc++

$(BUILD)/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay_main.c $(wildcard tests/fuzz/*.h) $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< tests/fuzz/replay_main.c $(STATIC) $(LDLIBS) $(if $(CU_OBJ),-lstdc++)

$(BUILD)/bench/%: bench/%.c $(STATIC)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -O3 $(BENCH_MARCH) -o $@ $< $(STATIC) $(LDLIBS) $(if $(CU_OBJ),-lstdc++)

$(BUILD)/examples/%: examples/%.c $(SHARED)
	@mkdir -p $(dir $@)
	$(CC) -Iinclude $(CFLAGS) -o $@ $< -L$(BUILD) -Wl,-rpath,'$$ORIGIN/..' -lkvq $(LDLIBS)

examples: $(EXAMPLE_BIN)
bench: check-deps $(BENCH_BIN)
fuzz-replay: $(FUZZ_REPLAY)

# ---- tests -------------------------------------------------------------------------
# `make test` installs what is missing, then rebuilds with warnings as errors.
test:
	@if [ -n "$(strip $(MISSING))" ] || ! $(PYTHON) -c 'import numpy, zstandard, regex, gguf' 2>/dev/null; then \
	  bash scripts/install-deps.sh; fi
	@m="$${KVQ_SMOLLM2:-$$(env -u KVQ_MODEL bash scripts/fetch-model.sh || true)}"; \
	  $(MAKE) --no-print-directory WERROR=1 KVQ_SMOLLM2="$$m" test-run

test-run: check-deps $(STATIC) $(SHARED) $(KVQ) $(TEST_BIN) $(FUZZ_REPLAY) $(EXAMPLE_BIN)
	@BUILD=$(BUILD) PYTHON=$(PYTHON) bash tests/run-tests.sh

# `make test-python`: the Python package's torch part (python/tests/test_hf.py: captures
# from HF transformers against the modules and `kvq capture`, SmolLM2 on the CPU). Installs
# torch (CPU wheels), transformers, accelerate, gguf and safetensors from PyPI once if
# missing. The numpy-only part (tests/py/test_python_pkg.py) runs in `make test`.
test-python: check-deps $(SHARED) $(KVQ) $(EXAMPLE_BIN)
	@$(PYTHON) -c 'import torch, transformers, accelerate, gguf, safetensors, xxhash' 2>/dev/null || { \
	  $(PYTHON) -c 'import torch' 2>/dev/null || \
	    $(PYTHON) -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu && \
	  $(PYTHON) -m pip install -q transformers accelerate gguf safetensors xxhash; }
	@m="$${KVQ_SMOLLM2:-$$(env -u KVQ_MODEL bash scripts/fetch-model.sh || true)}"; \
	  KVQ_BUILD=$(CURDIR)/$(BUILD) KVQ=$(CURDIR)/$(KVQ) KVQ_SMOLLM2="$$m" $(PYTHON) python/tests/test_hf.py
	@KVQ_BUILD=$(CURDIR)/$(BUILD) KVQ=$(CURDIR)/$(KVQ) $(PYTHON) python/tests/test_torch_backend.py; s=$$?; [ $$s -eq 0 ] || [ $$s -eq 77 ]

# `make test-cuda`: the CUDA build and its check against the CPU (scripts/test-cuda.sh).
test-cuda:
	@bash scripts/test-cuda.sh

# `make test-device-kit`: build the kit for a bare GPU machine (.device-kit/, sm_90, in
# build-kit/) and check it here: every library resolves inside it with the system's copies
# hidden, and scripts/device-run.sh runs to the end without a GPU (scripts/test-device-kit.sh).
test-device-kit:
	@bash scripts/test-device-kit.sh

# the CUDA build and tests/cuda/ (scripts/test-cuda.sh calls this with CUDA=1)
cuda-tests: check-deps $(STATIC) $(SHARED) $(KVQ) $(CUDA_TEST_BIN)

asan:
	@$(MAKE) --no-print-directory SAN=1 WERROR=1 test-run

# ---- fuzzing (clang libFuzzer) --------------------------------------------------------
FUZZ_CFLAGS := -std=c11 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
               -Iinclude -I. -D_GNU_SOURCE -DKVQ_UNSTABLE_API $(DEP_CFLAGS)
# The library is compiled once with the fuzzing flags (-fsanitize=fuzzer-no-link) and
# each target links against that archive.
FUZZ_OBJ := $(LIB_SRC:%.c=build-fuzz/obj/%.o)
build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS:-fsanitize=fuzzer,%=-fsanitize=fuzzer-no-link,%) -fopenmp=libgomp $(if $(findstring _avx512,$<),$(AVX512_FLAGS),$(if $(findstring _avx2,$<),$(AVX2_FLAGS))) -c $< -o $@

build-fuzz/libkvq-fuzz.a: $(FUZZ_OBJ)
	rm -f $@ && ar rcs $@ $^

build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(wildcard tests/fuzz/*.h) build-fuzz/libkvq-fuzz.a
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fopenmp=libgomp -o $@ $< build-fuzz/libkvq-fuzz.a $(DEP_LIBS) -lm -lpthread -lgomp

# After the libFuzzer targets, the long forms of the batteries `make test` runs short:
# the corruption battery (FUZZ_CORRUPT_CASES damaged copies per file and command) and
# the kill -9 test (FUZZ_KILL_ROUNDS kills per command), with a seed of their own.
FUZZ_CORRUPT_CASES ?= 400
FUZZ_KILL_ROUNDS ?= 20
fuzz: check-deps $(FUZZ_BIN) $(KVQ)
	@for f in $(FUZZ_BIN); do n=$${f#build-fuzz/fuzz_}; mkdir -p build-fuzz/corpus-$$n; \
	  echo "fuzz: $$n for $(FUZZ_TIME)s"; \
	  $$f -max_total_time=$(FUZZ_TIME) -print_final_stats=1 -artifact_prefix=build-fuzz/crash-$$n- \
	    build-fuzz/corpus-$$n tests/fuzz/corpus/$$n 2>&1 | grep -E 'stat::number_of_executed_units|ERROR|SUMMARY' ; done
	@export KVQ=$(CURDIR)/$(KVQ) KVQ_BUILD=$(CURDIR)/$(BUILD) PYTHON=$(PYTHON); \
	  KVQ_CORRUPT_CASES=$(FUZZ_CORRUPT_CASES) KVQ_CORRUPT_SEED=$$$$ bash tests/cli/corrupt.sh && \
	  KVQ_KILL_ROUNDS=$(FUZZ_KILL_ROUNDS) KVQ_KILL_SEED=$$$$ bash tests/cli/kill9.sh

# `make test-report`: `python -m kvq report` on a real calibration of the tiny model, the
# page opened in headless Chromium (tests/report/test_report.py, docs/report.md). Installs
# chromium and matplotlib (scripts/install-deps.sh) when missing.
test-report: check-deps $(SHARED) $(KVQ)
	@{ command -v chromium >/dev/null && $(PYTHON) -c 'import matplotlib' 2>/dev/null; } || \
	  bash scripts/install-deps.sh
	@KVQ_BUILD=$(CURDIR)/$(BUILD) KVQ=$(CURDIR)/$(KVQ) $(PYTHON) tests/report/test_report.py

# ---- demo ------------------------------------------------------------------------------
demo:
	@if [ -n "$(strip $(MISSING))" ] || [ ! -d /usr/share/doc/python3.11/html/_sources ] || \
	   ! $(PYTHON) -c 'import matplotlib' 2>/dev/null; then \
	  bash scripts/install-deps.sh; fi
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) bash scripts/demo.sh

clean:
	rm -rf build build-cuda build-asan build-fuzz

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_HELPER_OBJ:.o=.d)
