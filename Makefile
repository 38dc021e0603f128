# ursa - a software RDMA NIC in user space.
#
#   make            build build/lib/libibverbs.so.1 and build/bin/ursa
#   make test       build and run every test (ends with "N passed, N failed")
#   make sanitize   the same tests under AddressSanitizer + UBSan (build/asan)
#   make demo       run the demo (two QPs, registration, zero-copy transfers)
#   make install    install under $(PREFIX) (default /usr/local/lib/ursa)
#
# Variables: BUILD (output dir), SAN=1 (sanitizers), CC, EXTRA_CFLAGS.

BUILD ?= build
CC ?= cc
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib/ursa

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
	-Wmissing-prototypes -Wold-style-definition -Wno-missing-field-initializers
CFLAGS := -std=gnu11 -O2 -g -pthread -fPIC -fvisibility=hidden $(WARN) \
	-D_GNU_SOURCE $(EXTRA_CFLAGS)
LDFLAGS := -pthread
# Thread-local variables through TLS descriptors where the compiler has
# them (x86-64 GCC): an engine pass reads and writes a few on every poll,
# and the default model calls __tls_get_addr for each (about 17 of a
# same-host poll's 300 instructions); a descriptor resolves to a load.
CFLAGS += $(shell $(CC) -mtls-dialect=gnu2 -x c -c /dev/null -o /dev/null \
	2>/dev/null && echo -mtls-dialect=gnu2)
ifeq ($(SAN),1)
CFLAGS += -fsanitize=address,undefined -fno-sanitize-recover=all \
	-fno-omit-frame-pointer -O1
LDFLAGS += -fsanitize=address,undefined
endif

LIB_SRC := $(wildcard src/util/*.c src/core/*.c src/engine/*.c src/proto/*.c \
	src/transport/*.c src/verbs/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
LIB := $(BUILD)/lib/libibverbs.so.1
MAP := src/verbs/libibverbs.map

UNIT_SRC := $(wildcard tests/unit/*.c)
FUNC_SRC := $(wildcard tests/func/*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/unit_%)
FUNC_BIN := $(FUNC_SRC:tests/func/%.c=$(BUILD)/tests/func_%)
HARNESS := tests/harness.c

.PHONY: all test sanitize interop demo install clean tests bench bench-quick fuzz
BENCH_BIN := $(BUILD)/bench/samehost $(BUILD)/bench/netpeer $(BUILD)/bench/regcost
PROVIDERS := mlx5 mlx4 efa mana
STUBS := $(PROVIDERS:%=$(BUILD)/lib/lib%.so.1)
.SECONDARY: $(PROVIDERS:%=$(BUILD)/gen/lib%.c) $(PROVIDERS:%=$(BUILD)/gen/lib%.map)
PRELOAD := $(BUILD)/lib/libursa-preload.so
RDMACM := $(BUILD)/lib/librdmacm.so.1
RDMACM_SRC := $(wildcard src/rdmacm/*.c)
RDMACM_OBJ := $(RDMACM_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/src/proto/cm.o
all: $(LIB) $(BUILD)/lib/libibverbs.so $(RDMACM) $(BUILD)/bin/ursa $(BUILD)/bin/ursa-kv $(STUBS) \
	$(PRELOAD)

# The library that shows the device's sysfs tree and node to programs
# (src/preload/sysfs_preload.c). Never instrumented: it is preloaded into
# programs that are not, ahead of everything else.
$(PRELOAD): src/preload/sysfs_preload.c
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -fsanitize=% -fno-sanitize-recover=%,$(CFLAGS)) \
		-fno-delete-null-pointer-checks -shared -o $@ $< -ldl

# Stand-ins for the providers' direct-verbs libraries that perftest, UCX,
# libfabric and pyverbs link against, generated from the committed symbol
# lists (src/providers/gen.sh says why and how).
$(BUILD)/gen/lib%.c $(BUILD)/gen/lib%.map: src/providers/%.syms src/providers/gen.sh
	@mkdir -p $(dir $@)
	sh src/providers/gen.sh $< $(BUILD)/gen/lib$*.c $(BUILD)/gen/lib$*.map
$(BUILD)/lib/lib%.so.1: $(BUILD)/gen/lib%.c $(BUILD)/gen/lib%.map
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared -Wl,-soname,lib$*.so.1 \
		-Wl,--version-script=$(BUILD)/gen/lib$*.map $(LDFLAGS) -o $@ $<

$(BUILD)/obj/%.o: %.c $(wildcard src/*/*.h) include/ursa/ursa.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ) $(MAP)
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,libibverbs.so.1 -Wl,--version-script=$(MAP) \
		-Wl,-z,now -Wl,-z,defs $(LDFLAGS) -o $@ $(LIB_OBJ)

# librdmacm.so.1 (src/rdmacm): rdma_cm on ursa's libibverbs, the IB CM
# protocol on QP1 (docs/design.md, "Connection management").
$(RDMACM): $(RDMACM_OBJ) src/rdmacm/librdmacm.map $(BUILD)/lib/libibverbs.so
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,-soname,librdmacm.so.1 \
		-Wl,--version-script=src/rdmacm/librdmacm.map -Wl,-z,now \
		-Wl,-z,defs $(LDFLAGS) -o $@ $(RDMACM_OBJ) -L$(BUILD)/lib -libverbs

$(BUILD)/lib/libibverbs.so: $(LIB)
	ln -sf libibverbs.so.1 $@

# Tools and tests are ordinary verbs programs: system header, -libverbs,
# and ursa's library found first through -L / the library path.
APP_CFLAGS := $(filter-out -fvisibility=hidden,$(CFLAGS)) -Iinclude
APP_LDFLAGS := $(LDFLAGS) -L$(BUILD)/lib -Wl,-rpath-link,$(BUILD)/lib

# The ursa command finds ursa's library next to itself (build tree:
# ../lib, installed: ../lib/ursa), never the system's libibverbs.
$(BUILD)/bin/ursa: tools/ursa.c tools/setup.c tools/setup.h src/proto/cm.c src/proto/cm.h \
		$(LIB) $(BUILD)/lib/libibverbs.so
	@mkdir -p $(dir $@)
	$(CC) $(APP_CFLAGS) tools/ursa.c tools/setup.c src/proto/cm.c -o $@ $(APP_LDFLAGS) \
		-Wl,-rpath,'$$ORIGIN/../lib:$$ORIGIN/../lib/ursa' -libverbs

# The case study: a key-value store on verbs (apps/kv).
KV_SRC := $(wildcard apps/kv/*.c)
$(BUILD)/bin/ursa-kv: $(KV_SRC) $(wildcard apps/kv/*.h) $(LIB) $(BUILD)/lib/libibverbs.so
	@mkdir -p $(dir $@)
	$(CC) $(APP_CFLAGS) $(KV_SRC) -o $@ $(APP_LDFLAGS) \
		-Wl,-rpath,'$$ORIGIN/../lib:$$ORIGIN/../lib/ursa' -libverbs

tests: $(UNIT_BIN) $(FUNC_BIN) $(BUILD)/tests/xfer $(BUILD)/tests/fuzz_pkt \
	$(BUILD)/tests/fuzz_resp $(BUILD)/tests/fuzz_chan

# Fuzz targets: a corpus replayer (make test), or libFuzzer (make fuzz).
$(BUILD)/tests/fuzz_pkt: tests/fuzz/fuzz_pkt.c src/proto/roce.c src/proto/roce.h
	@mkdir -p $(dir $@)
	$(CC) $(APP_CFLAGS) tests/fuzz/fuzz_pkt.c src/proto/roce.c -o $@ $(LDFLAGS)

# The responder and channel targets link the library's objects directly.
$(BUILD)/tests/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.h $(LIB_OBJ) $(wildcard src/*/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(APP_CFLAGS) $< $(LIB_OBJ) -o $@ $(LDFLAGS)

FUZZ_SECONDS ?= 60
fuzz:
	@mkdir -p build/fuzz
	clang -g -O1 -fsanitize=fuzzer,address,undefined -DURSA_LIBFUZZER \
		tests/fuzz/fuzz_pkt.c src/proto/roce.c -o build/fuzz/fuzz_pkt
	mkdir -p build/fuzz/corpus && cp tests/fuzz/corpus/pkt/* build/fuzz/corpus/
	build/fuzz/fuzz_pkt -max_total_time=$(FUZZ_SECONDS) build/fuzz/corpus
	clang -g -O1 -fsanitize=fuzzer,address,undefined -DURSA_LIBFUZZER \
		-D_GNU_SOURCE -pthread tests/fuzz/fuzz_resp.c $(LIB_SRC) \
		-o build/fuzz/fuzz_resp
	mkdir -p build/fuzz/corpus_resp && cp tests/fuzz/corpus/resp/* build/fuzz/corpus_resp/
	build/fuzz/fuzz_resp -max_total_time=$(FUZZ_SECONDS) build/fuzz/corpus_resp
	clang -g -O1 -fsanitize=fuzzer,address,undefined -DURSA_LIBFUZZER \
		-D_GNU_SOURCE -pthread tests/fuzz/fuzz_chan.c $(LIB_SRC) \
		-o build/fuzz/fuzz_chan
	mkdir -p build/fuzz/corpus_chan && cp tests/fuzz/corpus/chan/* build/fuzz/corpus_chan/
	build/fuzz/fuzz_chan -max_total_time=$(FUZZ_SECONDS) build/fuzz/corpus_chan

$(BUILD)/tests/xfer: tests/hosts/xfer.c $(LIB) $(BUILD)/lib/libibverbs.so
	@mkdir -p $(dir $@)
	$(CC) $(APP_CFLAGS) $< -o $@ $(APP_LDFLAGS) -libverbs

# Unit tests link the pure modules directly.
UNIT_DEPS := src/core/keytab.c src/core/pin.c src/core/mtt.c src/core/vma.c src/proto/roce.c \
	src/proto/cm.c \
	src/core/pub.c src/core/rcache.c \
	src/core/qpstate.c src/util/util.c src/util/config.c apps/kv/kv_table.c \
	apps/kv/kv_common.c
$(BUILD)/tests/unit_%: tests/unit/%.c $(HARNESS) tests/harness.h $(UNIT_DEPS) \
		$(wildcard src/*/*.h) $(wildcard apps/kv/*.h) include/ursa/ursa.h
	@mkdir -p $(dir $@)
	$(CC) $(APP_CFLAGS) $< $(HARNESS) $(UNIT_DEPS) -o $@ $(LDFLAGS)

$(BUILD)/tests/func_%: tests/func/%.c $(HARNESS) tests/harness.h \
		tests/func/common.h $(LIB) $(BUILD)/lib/libibverbs.so
	@mkdir -p $(dir $@)
	$(CC) $(APP_CFLAGS) $< $(HARNESS) -o $@ $(APP_LDFLAGS) -libverbs

# (the CM and rsockets tests link ursa's librdmacm too)
$(BUILD)/tests/func_cm $(BUILD)/tests/func_rsocket: $(BUILD)/tests/func_%: \
		tests/func/%.c $(HARNESS) tests/harness.h $(LIB) $(RDMACM) \
		$(BUILD)/lib/libibverbs.so
	@mkdir -p $(dir $@)
	$(CC) $(APP_CFLAGS) $< $(HARNESS) -o $@ $(APP_LDFLAGS) -l:librdmacm.so.1 -libverbs

$(BUILD)/bench/%: bench/%.c $(LIB) $(BUILD)/lib/libibverbs.so
	@mkdir -p $(dir $@)
	$(CC) $(APP_CFLAGS) -Wno-unused-result $< -o $@ $(APP_LDFLAGS) -libverbs

# The benchmark report (bench/report.sh): bench/out/report.md, CSV, SVG.
bench: all $(BENCH_BIN)
	sh bench/report.sh $(BUILD)

# The same in about a minute: CI's smoke run (asserts no speed).
bench-quick: all $(BENCH_BIN)
	sh bench/report.sh --quick $(BUILD)

test: all tests $(BENCH_BIN)
	@BUILD=$(BUILD) sh tests/run.sh

sanitize:
	$(MAKE) BUILD=build/asan SAN=1 test

# ursa against the kernel's Soft-RoCE in a qemu guest (tests/interop/rxe.sh)
interop: all
	@BUILD=$(BUILD) sh tests/interop/rxe.sh

demo: all
	LD_LIBRARY_PATH=$(BUILD)/lib $(BUILD)/bin/ursa demo

install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PREFIX)/bin \
		$(DESTDIR)$(PREFIX)/include/ursa
	install -m 755 $(LIB) $(RDMACM) $(STUBS) $(PRELOAD) $(DESTDIR)$(LIBDIR)/
	ln -sf libibverbs.so.1 $(DESTDIR)$(LIBDIR)/libibverbs.so
	install -m 644 include/ursa/ursa.h $(DESTDIR)$(PREFIX)/include/ursa/
	install -m 755 $(BUILD)/bin/ursa $(DESTDIR)$(PREFIX)/bin/ursa

clean:
	rm -rf build
