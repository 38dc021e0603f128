// SPDX-License-Identifier: MIT
/*
 * efa.c - a stand-in libefa.so.1 for perftest (see mlx5.c): ursa's device
 * is not an EFA device, so every entry point refuses with EOPNOTSUPP.
 */
#include <errno.h>
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT void *efadv_create_qp_ex(void);
EXPORT void *efadv_create_qp_ex(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

EXPORT int efadv_query_device(void);
EXPORT int efadv_query_device(void)
{
	return EOPNOTSUPP;
}
