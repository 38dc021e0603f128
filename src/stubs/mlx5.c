// SPDX-License-Identifier: MIT
/*
 * mlx5.c - a stand-in libmlx5.so.1. perftest is linked against the mlx5
 * direct-verbs library and so needs it to load, but calls it only for
 * mlx5-only features (DC, AES-XTS). ursa's device is not an mlx5 device:
 * every entry point refuses with EOPNOTSUPP, as libmlx5 does for a device
 * it does not drive.
 */
#include <errno.h>
#include <stddef.h>

#define EXPORT __attribute__((visibility("default")))

#define REFUSE_PTR(name) \
	EXPORT void *name(void); \
	EXPORT void *name(void) { errno = EOPNOTSUPP; return NULL; }
#define REFUSE_INT(name) \
	EXPORT int name(void); \
	EXPORT int name(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }

REFUSE_PTR(mlx5dv_create_qp)
REFUSE_INT(mlx5dv_devx_general_cmd)
REFUSE_PTR(mlx5dv_open_device)
REFUSE_PTR(mlx5dv_create_mkey)
REFUSE_INT(mlx5dv_destroy_mkey)
REFUSE_PTR(mlx5dv_qp_ex_from_ibv_qp_ex)
REFUSE_INT(mlx5dv_crypto_login)
REFUSE_PTR(mlx5dv_dek_create)
REFUSE_INT(mlx5dv_dek_destroy)
REFUSE_INT(mlx5dv_is_supported)
REFUSE_INT(mlx5dv_query_device)
