// SPDX-License-Identifier: MIT
/*
 * cm_forge.c - a local user attacks other users' rdma_cm connections
 * (tests/scripts/isolation.sh). ursa's connection sockets are abstract
 * names that /proc/net/unix shows to everyone, comm IDs included
 * ("@ursa/cm/c/<comm ID>"), so this program needs to guess nothing a
 * same-host connection holds: to every connection socket it sends, in the
 * forwarding format (struct cm_fwd), a DREQ and a REJ naming that socket's
 * comm ID as the receiver's and every other listed comm ID as the
 * sender's, from each source address given. A process that takes them
 * ends the connection; ursa's takes CM messages only from its own user,
 * root and the holders of the RoCEv2 port.
 *
 *   cm_forge IPV4...        prints how many datagrams the sockets took
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../src/proto/cm.h"

#define MAX_IDS 256

static int list_ids(uint32_t *ids)
{
	FILE *f = fopen("/proc/net/unix", "r");
	char line[512];
	int n = 0;

	while (f && n < MAX_IDS && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "@ursa/cm/c/");

		if (p)
			ids[n++] = (uint32_t)strtoul(p + 11, NULL, 16);
	}
	if (f)
		fclose(f);
	return n;
}

int main(int argc, char **argv)
{
	uint32_t ids[MAX_IDS];
	int n = list_ids(ids), fd = socket(AF_UNIX, SOCK_DGRAM, 0), sent = 0;

	if (fd < 0 || argc < 2) {
		fprintf(stderr, "usage: cm_forge IPV4...\n");
		return 2;
	}
	for (int t = 0; t < n; t++) {
		struct sockaddr_un sa;
		socklen_t sl = cm_route_addr(&sa, ids[t], false);

		for (int p = 0; p < n; p++) {
			for (int a = 1; a < argc; a++) {
				struct cm_fwd fw = { .magic = CM_FWD_MAGIC,
						     .sport = 0xc000, .hop = 64 };
				struct cm_msg m = { 0 };

				fw.src[10] = fw.src[11] = 0xff;
				if (inet_pton(AF_INET, argv[a], fw.src + 12) != 1)
					return 2;
				memcpy(fw.dst, fw.src, 16);
				for (int k = 0; k < 2; k++) {
					m.attr = k ? CM_REJ : CM_DREQ;
					m.local_id = ids[p];
					m.remote_id = ids[t];
					m.reason = 28;	/* consumer */
					m.msg = CM_MSG_REP;
					if (cm_build(fw.mad, &m))
						return 2;
					sent += sendto(fd, &fw, sizeof(fw), MSG_DONTWAIT,
						       (struct sockaddr *)&sa, sl) ==
						(ssize_t)sizeof(fw);
				}
			}
		}
	}
	printf("%d connection sockets, %d forged datagrams taken\n", n, sent);
	return 0;
}
