/* SPDX-License-Identifier: MIT */
/*
 * replay.h - the corpus replayer of the fuzz targets that link the library
 * (fuzz_resp, fuzz_chan): outside libFuzzer, main() feeds every file of the
 * directories it is given to LLVMFuzzerTestOneInput, which aborts on a
 * finding. Returns how many inputs ran.
 */
#ifndef URSA_FUZZ_REPLAY_H
#define URSA_FUZZ_REPLAY_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static inline int fuzz_replay(int argc, char **argv)
{
	static uint8_t in[8192];
	int n = 0;

	for (int i = 1; i < argc; i++) {
		DIR *d = opendir(argv[i]);
		struct dirent *e;

		while (d && (e = readdir(d))) {
			char p[4096];
			size_t k;
			FILE *f;

			if (e->d_name[0] == '.')
				continue;
			snprintf(p, sizeof(p), "%s/%s", argv[i], e->d_name);
			f = fopen(p, "rb");
			if (!f)
				continue;
			k = fread(in, 1, sizeof(in), f);
			fclose(f);
			LLVMFuzzerTestOneInput(in, k);
			n++;
		}
		if (d)
			closedir(d);
	}
	return n;
}

#endif
